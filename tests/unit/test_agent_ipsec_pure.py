"""The IPsec agent's pure decisions, table-driven: plan diff, status from list-sas snapshots (including a
CHILD_SA rekey as charon 5.9.8 shows it, LAB-FACTS), charon's failure reasons, the session state machine,
backoffs and the watchdog."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent.health import Snapshot, respond, split_listen
from agent.ipsec.link import (
    Attempt,
    Conn,
    Initiate,
    Link,
    after_attempt,
    initiate_backoff,
    reconnect_backoff,
    step,
    watchdog,
)
from agent.ipsec.plan import Loaded, PlanRejected, SecretState, conn_digest, desired, diff, stale_children
from agent.ipsec.status import Carry, Counters, reason_from_log, tunnels_status, tunnels_summary
from agent.sink import backoff as sink_backoff
from gwkit.httpd import parse_request_line
from gwplan import Child, GatewayRef, IkeSecret, Ipsec, Plan, SecretRef, Tunnel

NOW = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)
GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw")


def tunnel(name: str, *children: str, initiate: bool = True, extra: dict[str, Any] | None = None) -> Tunnel:
    kids = children or (f"{name}-0",)
    conn = {
        name: {"version": "2", "children": {c: {"remote_ts": ["10.0.0.0/24"]} for c in kids}, **(extra or {})}
    }
    return Tunnel(name, initiate, tuple(Child(c, f"10.{i}.0.0/24") for i, c in enumerate(kids)), conn)


def plan(*tunnels: Tunnel, secrets: tuple[IkeSecret, ...] = ()) -> Plan:
    return Plan(gateway=GW, type="ipsec", ipsec=Ipsec(secrets=secrets, tunnels=tunnels))


def child(name: str, uid: int, state: str = "INSTALLED", bytes_: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "uniqueid": str(uid),
        "state": state,
        "bytes-in": str(bytes_),
        "bytes-out": str(bytes_ * 2),
        "packets-in": str(bytes_ // 100),
        "packets-out": str(bytes_ // 50),
        "rekey-time": "100",
        "install-time": "10",
        **more,
    }


def ike(
    name: str, uid: int, state: str = "ESTABLISHED", *children: dict[str, Any], **more: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "uniqueid": str(uid),
        "state": state,
        "established": "60",
        "rekey-time": "3000",
        "child-sas": {f"{c['name']}-{c['uniqueid']}": c for c in children},
        **more,
    }


def sas(*ikes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {sa["uniqueid"]: sa for sa in ikes}


# --- plan ---------------------------------------------------------------------------------------------


PSK_A = IkeSecret("psk-a", ("a",), SecretRef("s", "k"))


def test_diff_loads_new_and_changed_unloads_removed_and_leaves_the_rest() -> None:
    a, b, c = tunnel("a"), tunnel("b"), tunnel("c")
    b2 = tunnel("b", extra={"rekey_time": "1h"})
    loaded = Loaded(
        conns={"a": conn_digest(a.conn), "b": conn_digest(b.conn), "old": "x"},
        secrets={"psk-a": SecretState(("a",), "v1", PSK_A.ref), "gone": SecretState((), "v0")},
    )
    changes = diff(loaded, desired(plan(a, b2, c, secrets=(PSK_A,))), {"psk-a": "v1"})
    assert changes.load_conns == ("b", "c")
    assert changes.unload_conns == ("old",)
    assert changes.load_secrets == () and changes.unload_secrets == ("gone",)


@pytest.mark.parametrize(
    "versions, loaded_version, loaded_ref, expected",
    [
        pytest.param({"psk-a": "v2"}, "v1", PSK_A.ref, ("psk-a",), id="rotated"),
        pytest.param({"psk-a": "v1"}, "v1", PSK_A.ref, (), id="unchanged"),
        pytest.param({"psk-a": "v1"}, "v1", SecretRef("t", "k"), ("psk-a",), id="moved-same-value"),
        pytest.param({}, "v1", PSK_A.ref, (), id="unreadable-keeps-the-loaded-key"),
        pytest.param({"psk-a": "v1"}, "unknown", None, ("psk-a",), id="after-reconnect"),
    ],
)
def test_secret_changes(
    versions: dict[str, str], loaded_version: str, loaded_ref: SecretRef | None, expected: tuple[str, ...]
) -> None:
    loaded = Loaded(secrets={"psk-a": SecretState(("a",), loaded_version, loaded_ref)})
    changes = diff(loaded, desired(plan(secrets=(PSK_A,))), versions)
    assert changes.load_secrets == expected and changes.unload_secrets == ()


@pytest.mark.parametrize(
    "bad, needle",
    [
        pytest.param(plan(tunnel("a"), tunnel("a")), "ipsec.tunnels[1].name: 'a' is used twice", id="dup"),
        pytest.param(
            plan(Tunnel("a", True, (Child("zz", "10.0.0.0/24"),), tunnel("a").conn)),
            "ipsec.tunnels[0].children[0].name: 'zz' is not a child of conn 'a'",
            id="child-not-in-conn",
        ),
        pytest.param(
            plan(Tunnel("a", True, (), {"b": {}})),
            "ipsec.tunnels[0].conn: must be one connection named 'a'",
            id="name",
        ),
        pytest.param(
            plan(secrets=(PSK_A, PSK_A)), "ipsec.secrets[1].id: 'psk-a' is used twice", id="secret-dup"
        ),
    ],
)
def test_inconsistent_plans_are_rejected_naming_the_field(bad: Plan, needle: str) -> None:
    with pytest.raises(PlanRejected) as info:
        desired(bad)
    assert needle in str(info.value)


def test_stale_children_are_those_the_plan_no_longer_has() -> None:
    t = tunnel("a", "a-0")
    snap = sas(ike("a", 1, "ESTABLISHED", child("a-0", 1), child("a-1", 2), child("a-2", 3, "DELETED")))
    assert stale_children((t,), snap) == [("a", "2")]


# --- status -------------------------------------------------------------------------------------------


def one(t: Tunnel, snap: Any, carry: Any = None, **kw: Any) -> Any:
    (st,), new_carry = tunnels_status((t,), snap, now=NOW, errors=kw.pop("errors", {}), carry=carry, **kw)
    return st, new_carry


def test_an_unanswered_snapshot_keeps_the_counter_carry() -> None:
    """charon hung (SIGSTOP): every tunnel reads Down, but the SAs may still be there when it answers
    again, so what retired SAs contributed must not be forgotten (bytes would go backwards)."""
    t = tunnel("a", "a-0")
    kept = {"a": Carry(retired=Counters(bytes_in=500, bytes_out=700), retired_ids=frozenset({"1"}))}
    st, new_carry = one(t, None, carry=kept, daemon_error="charon unreachable: no answer")
    assert st.state == "Down" and new_carry == kept


def test_established_tunnel_times_come_from_charons_seconds() -> None:
    t = tunnel("a")
    st, _ = one(t, sas(ike("a", 1, "ESTABLISHED", child("a-0", 1, bytes_=500))))
    d = st.to_dict()
    assert d["state"] == "Established" and d["lastError"] is None
    assert d["establishedAt"] == "2026-11-30T00:59:00Z"  # established: seconds since
    assert d["rekeyAt"] == "2026-11-30T01:50:00Z"  # rekey-time: seconds remaining
    assert (d["bytesIn"], d["bytesOut"], d["packetsIn"], d["packetsOut"]) == (500, 1000, 5, 10)
    assert d["children"] == [
        {
            "name": "a-0",
            "remoteSubnet": "10.0.0.0/24",
            "state": "Established",
            "rekeyAt": "2026-11-30T01:01:40Z",
        }
    ]


def test_a_child_rekey_as_charon_shows_it_never_flaps_and_never_drops_the_counters() -> None:
    """Initiator sequence (LAB-FACTS): INSTALLED -> REKEYING -> DELETING+INSTALLED -> DELETED+INSTALLED,
    then only the new SA; the new SA's counters start from 0, the old one's are frozen."""
    t = tunnel("a")
    timeline = [
        [child("a-0", 1, "INSTALLED", 1000)],
        [child("a-0", 1, "REKEYING", 1100)],
        [child("a-0", 1, "DELETING", 1200), child("a-0", 2, "INSTALLED", 0)],
        [child("a-0", 1, "DELETED", 1200), child("a-0", 2, "INSTALLED", 50)],
        [child("a-0", 1, "DELETED", 1200), child("a-0", 2, "INSTALLED", 80)],
        [child("a-0", 2, "INSTALLED", 150)],
        [child("a-0", 2, "INSTALLED", 300)],
    ]
    carry: dict[str, Carry] | None = None
    seen = []
    for children in timeline:
        st, carry = one(t, sas(ike("a", 7, "ESTABLISHED", *children)), carry)
        seen.append((st.state, st.counters.bytes_in))
    assert [s for s, _ in seen] == ["Established"] * len(timeline)
    assert [b for _, b in seen] == [1000, 1100, 1200, 1250, 1280, 1350, 1500]


def test_a_rekey_missed_between_two_snapshots_still_keeps_the_old_counters() -> None:
    t = tunnel("a")
    _, carry = one(t, sas(ike("a", 1, "ESTABLISHED", child("a-0", 1, "INSTALLED", 1000))))
    st, _ = one(t, sas(ike("a", 1, "ESTABLISHED", child("a-0", 9, "INSTALLED", 10))), carry)
    assert st.counters.bytes_in == 1010


@pytest.mark.parametrize(
    "snap, kw, state, error",
    [
        pytest.param(sas(), {}, "Down", None, id="nothing"),
        pytest.param(
            sas(),
            {"errors": {"a": "AUTHENTICATION_FAILED: x"}},
            "Failed",
            "AUTHENTICATION_FAILED: x",
            id="failed",
        ),
        pytest.param(sas(), {"in_flight": frozenset({"a"})}, "Connecting", None, id="initiating"),
        pytest.param(sas(ike("a", 1, "CONNECTING")), {}, "Connecting", None, id="ike-connecting"),
        pytest.param(
            sas(ike("a", 1, "ESTABLISHED", child("a-0", 1))), {}, "Connecting", None, id="one-child-missing"
        ),
        pytest.param(
            sas(ike("a", 1, "ESTABLISHED", child("a-0", 1), child("a-1", 2, "INSTALLING"))),
            {},
            "Connecting",
            None,
            id="child-installing",
        ),
        pytest.param(
            None,
            {"daemon_error": "charon unreachable: refused"},
            "Down",
            "charon unreachable: refused",
            id="no-charon",
        ),
    ],
)
def test_tunnel_states(snap: Any, kw: dict[str, Any], state: str, error: str | None) -> None:
    st, _ = one(tunnel("a", "a-0", "a-1"), snap, **kw)
    assert (st.state, st.last_error) == (state, error)


def test_two_children_two_sas_and_an_ike_rekey_window() -> None:
    t = tunnel("a", "a-0", "a-1")
    snap = sas(
        ike("a", 1, "REKEYED", established="3000"),
        ike("a", 2, "ESTABLISHED", child("a-0", 3, bytes_=10), child("a-1", 4, bytes_=20), established="1"),
    )
    st, _ = one(t, snap)
    assert st.state == "Established" and st.counters.bytes_in == 30
    assert st.established_at == "2026-11-30T00:59:59Z", "the new IKE_SA represents the tunnel"


def test_reason_from_log_prefers_charons_specific_cause() -> None:
    lines = [
        "establishing CHILD_SA s1-0{1}",
        "received AUTHENTICATION_FAILED notify error",
        "establishing connection 's1' failed",
    ]
    reason = reason_from_log(lines)
    assert reason is not None and reason.startswith("AUTHENTICATION_FAILED")
    assert reason_from_log(["giving up after 3 retransmits"]) == (
        "peer not responding: gave up after retransmits (giving up after 3 retransmits)"
    )
    assert reason_from_log(["establishing CHILD_SA 'x' failed"]) is None


# --- link ---------------------------------------------------------------------------------------------


def test_session_state_machine() -> None:
    c = step(Conn(), "connected")
    assert c.link is Link.PUSHING
    c = step(c, "lost")
    assert c == Conn(Link.DOWN, 1)
    c = step(step(step(c, "connected"), "pushed"), "lost")
    assert c == Conn(Link.DOWN, 1), "a successful push resets the failures"
    with pytest.raises(ValueError, match="'pushed' while down"):
        step(Conn(), "pushed")
    with pytest.raises(ValueError):
        step(Conn(Link.READY), "connected")


def test_backoffs_grow_and_are_bounded() -> None:
    assert [reconnect_backoff(n) for n in (1, 2, 3, 4, 5, 50)] == [0.02, 0.04, 0.08, 0.16, 0.25, 0.25]
    assert initiate_backoff(1) == 1.0 and initiate_backoff(100) == 30.0
    assert sink_backoff(1) < sink_backoff(3) <= 30.0
    a = after_attempt(Attempt(), False, 100.0)
    assert a == Attempt(1, 101.0)
    assert after_attempt(a, True, 200.0) == Attempt()


def test_watchdog_initiates_only_what_is_down_and_never_duplicates() -> None:
    up, down, busy, half, responder, flying, waiting = (
        tunnel("up"),
        tunnel("down", "down-0", "down-1"),
        tunnel("busy"),
        tunnel("half", "half-0", "half-1"),
        tunnel("responder", initiate=False),
        tunnel("flying"),
        tunnel("waiting"),
    )
    snap = sas(
        ike("up", 1, "ESTABLISHED", child("up-0", 1)),
        ike("busy", 2, "CONNECTING"),
        ike("half", 3, "ESTABLISHED", child("half-0", 3)),
    )
    actions = watchdog(
        (up, down, busy, half, responder, flying, waiting),
        snap,
        in_flight=frozenset({"flying"}),
        attempts={"waiting": Attempt(2, 50.0)},
        now=10.0,
    )
    assert actions == [Initiate("down", ("down-0", "down-1")), Initiate("half", ("half-1",))]
    later = watchdog(
        (waiting,), snap, in_flight=frozenset(), attempts={"waiting": Attempt(2, 50.0)}, now=50.0
    )
    assert later == [Initiate("waiting", ("waiting-0",))]


# --- health / sink helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, snap, code",
    [
        pytest.param("/healthz", Snapshot(5, False, "charon down"), 200, id="live-while-charon-down"),
        pytest.param("/healthz", Snapshot(61, True, "ok"), 503, id="stalled-loop"),
        pytest.param("/readyz", Snapshot(1, False, "charon down"), 503, id="not-ready"),
        pytest.param("/readyz", Snapshot(1, True, "pushed"), 200, id="ready"),
        pytest.param("/other", Snapshot(1, True, "pushed"), 404, id="unknown"),
    ],
)
def test_probe_answers(path: str, snap: Snapshot, code: int) -> None:
    assert respond(path, snap, stale_after=60)[0] == code


def test_request_line_and_listen_parsing() -> None:
    assert parse_request_line(b"GET /readyz?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == ("GET", "/readyz")
    assert parse_request_line(b"POST / HTTP/1.1\r\n\r\n") is None
    assert split_listen("0.0.0.0:8081") == ("0.0.0.0", 8081)
    assert split_listen("[::1]:9") == ("::1", 9)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_listen("8081x")


def test_the_summary_counts_established_tunnels() -> None:
    """status.tunnelsSummary (the VPNGateway's Tunnels column): Established tunnels of the plan's."""
    up, offline = tunnel("up"), tunnel("offline")
    statuses, _ = tunnels_status(
        (up, offline), sas(ike("up", 1, "ESTABLISHED", child("up-0", 2))), now=NOW, errors={}
    )
    assert [s.state for s in statuses] == ["Established", "Down"]
    assert tunnels_summary(statuses) == "1/2 up"
    assert tunnels_summary([]) == "0/0 up"
