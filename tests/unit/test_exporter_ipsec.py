"""exporter.ipsec (pure): counters that survive CHILD_SA rekeys, charon restarts and late events."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.ipsec import (
    CHILD_INFO_LABELS,
    Carry,
    Counts,
    Listed,
    Listing,
    PlanTunnel,
    observe_event,
    observe_listing,
    totals,
    view,
)

E1 = "1790000000"


def child(
    uid: int, name: str = "c0", nbytes: int = 0, state: str = "INSTALLED", **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "uniqueid": str(uid),
        "state": state,
        "bytes-in": str(nbytes),
        "bytes-out": str(2 * nbytes),
        "packets-in": str(nbytes // 100),
        "packets-out": str(nbytes // 50),
        "remote-ts": ["10.1.0.0/24"],
        "local-ts": ["10.0.0.0/24"],
        **extra,
    }


def ike(uid: int, *children: dict[str, Any], name: str = "t1", state: str = "ESTABLISHED") -> dict[str, Any]:
    return {
        "name": name,
        "uniqueid": str(uid),
        "state": state,
        "established": "5",
        "child-sas": {f"{c['name']}-{c['uniqueid']}": c for c in children},
    }


def listing(*sas: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {sa["uniqueid"]: sa for sa in sas}


def rekey_event(old: dict[str, Any], new: dict[str, Any], name: str = "t1") -> dict[str, Any]:
    return {name: {"uniqueid": "1", "child-sas": {"old": old, "new": new}}}


def run(steps: list[tuple[str, Any]], epoch: str = E1) -> list[int]:
    """Apply listings / events in order; return tunnel t1's bytes-in total after each step."""
    carry = Carry()
    out = []
    for i, (kind, payload) in enumerate(steps):
        if kind == "list":
            carry, _ = observe_listing(carry, payload, epoch=epoch, now=1000.0 + i)
        else:
            carry = observe_event(carry, kind, payload, epoch=epoch, now=1000.0 + i)
        out.append(totals(carry).get(("t1", "c0"), Counts()).bytes_in)
    return out


@pytest.mark.parametrize(
    "steps, expected",
    [
        pytest.param(
            [
                ("list", listing(ike(1, child(1, nbytes=100)))),
                ("list", listing(ike(1, child(1, nbytes=150, state="REKEYED"), child(2, nbytes=10)))),
                ("child-rekey", rekey_event(child(1, nbytes=150), child(2, nbytes=10))),
                ("list", listing(ike(1, child(1, nbytes=150, state="DELETED"), child(2, nbytes=30)))),
                ("list", listing(ike(1, child(2, nbytes=50)))),
            ],
            [100, 160, 160, 180, 200],
            id="rekey-seen-by-listing-then-event",
        ),
        pytest.param(
            [
                ("list", listing(ike(1, child(1, nbytes=100)))),
                ("child-rekey", rekey_event(child(1, nbytes=170), child(2, nbytes=0))),
                ("list", listing(ike(1, child(1, nbytes=170, state="REKEYED"), child(2, nbytes=5)))),
                ("list", listing(ike(1, child(2, nbytes=40)))),
            ],
            [100, 170, 175, 210],
            id="event-first-frozen-old-sa-not-counted-twice",
        ),
        pytest.param(
            [
                ("list", listing(ike(1, child(1, nbytes=100)))),
                ("list", listing(ike(1, child(2, nbytes=20)))),
                ("child-rekey", rekey_event(child(1, nbytes=130), child(2, nbytes=0))),
            ],
            [100, 120, 150],
            id="late-event-adds-only-the-difference",
        ),
        pytest.param(
            [
                ("list", listing(ike(1, child(1, nbytes=100)))),
                ("child-updown", {"t1": ike(1, child(1, nbytes=120))}),
                ("list", listing()),
                ("child-updown", {"up": "yes", "t1": ike(2, child(3, nbytes=0))}),
                ("list", listing(ike(2, child(3, nbytes=7)))),
            ],
            [100, 120, 120, 120, 127],
            id="down-then-up-keeps-counting",
        ),
        pytest.param(
            [
                ("child-rekey", rekey_event(child(8, nbytes=300), child(9, nbytes=0))),
                ("list", listing(ike(1, child(9, nbytes=4)))),
            ],
            [300, 304],
            id="sa-never-listed-counted-from-its-event",
        ),
        pytest.param(
            [
                ("list", listing(ike(1, child(1, nbytes=100)))),
                ("list", listing()),  # missed (children moving to a rekeyed IKE_SA mid-enumeration)
                ("list", listing(ike(2, child(1, nbytes=150)))),  # it was live all along
                ("list", listing(ike(2, child(1, nbytes=1000)))),
                ("child-rekey", rekey_event(child(1, nbytes=1010), child(2, nbytes=0))),
                ("list", listing(ike(2, child(2, nbytes=5)))),
            ],
            [100, 100, 150, 1000, 1010, 1015],
            id="sa-missed-by-one-listing-comes-back-without-double-counting",
        ),
    ],
)
def test_totals_are_monotonic_and_exact(steps: list[tuple[str, Any]], expected: list[int]) -> None:
    got = run(steps)
    assert got == expected
    assert got == sorted(got)


def test_a_restarted_charon_reusing_unique_ids_is_a_new_epoch() -> None:
    carry, _ = observe_listing(Carry(), listing(ike(1, child(1, nbytes=100))), epoch=E1, now=1.0)
    carry, _ = observe_listing(carry, listing(), epoch=E1, now=2.0)  # charon gone: SA retired
    # Restarted charon: unique id 1 again, counting from 0.
    carry, _ = observe_listing(carry, listing(ike(1, child(1, nbytes=5))), epoch="1790000099", now=3.0)
    assert totals(carry)[("t1", "c0")].bytes_in == 105


def test_view_rows_for_configured_down_tunnels_and_offline_daemon() -> None:
    plan = [
        PlanTunnel("t1", {"c0": "10.1.0.0/24"}),
        PlanTunnel("t2", {"c0": "10.2.0.0/24", "c1": "10.3.0.0/24"}),
    ]
    sas = listing(ike(1, child(1, "c0", 100, "INSTALLED", **{"rekey-time": "50", "install-time": "3"})))
    carry, listed = observe_listing(Carry(), sas, epoch=E1, now=1000.0, plan=plan)
    v = view(carry, listed, plan, epoch=E1)
    t = {x.name: x for x in v.tunnels}
    assert (t["t1"].up, t["t1"].established, t["t1"].next_rekey) == (True, 995.0, 1050.0)
    assert (t["t2"].up, t["t2"].configured, t["t2"].children_configured) == (False, True, 2)
    assert {(c.tunnel, c.child, c.subnet, c.up) for c in v.children} == {
        ("t1", "c0", "10.1.0.0/24", True),
        ("t2", "c0", "10.2.0.0/24", False),
        ("t2", "c1", "10.3.0.0/24", False),
    }
    assert (
        len(v.ike_info) == 1
        and dict(zip(CHILD_INFO_LABELS, v.child_info[0].values, strict=True))["uniqueid"] == "1"
    )
    offline = view(carry, None, plan, epoch=E1)
    assert [x.up for x in offline.tunnels] == [False, False]
    assert offline.tunnels[0].counts.bytes_in == 100, "counters hold their value while charon is away"
    assert offline.ike_info == () and offline.child_info == ()


def test_a_tunnel_removed_from_the_plan_and_gone_from_charon_leaves_the_metrics() -> None:
    """A deprovisioned peer must not report "down" forever (VpnTunnelDown would never clear)."""
    both = [PlanTunnel("t1", {"c0": "10.1.0.0/24"}), PlanTunnel("old", {"c0": "10.9.0.0/24"})]
    sas = listing(ike(1, child(1, "c0", 100)), ike(2, child(2, "c0", 50), name="old"))
    carry, listed = observe_listing(Carry(), sas, epoch=E1, now=1000.0)
    assert {t.name for t in view(carry, listed, both, epoch=E1).tunnels} == {"t1", "old"}
    # The plan drops "old" and the agent terminates its SA: charon no longer lists it.
    gone = listing(ike(1, child(1, "c0", 120)))
    carry, listed = observe_listing(carry, gone, epoch=E1, now=1010.0)
    after = view(carry, listed, both[:1], epoch=E1)
    assert [t.name for t in after.tunnels] == ["t1"]
    assert {c.tunnel for c in after.children} == {"t1"}
    # Still planned but down: the row stays, with its carried counters.
    down = view(carry, Listed(), both, epoch=E1)  # charon answered: no SAs
    assert {t.name: t.up for t in down.tunnels} == {"t1": False, "old": False}


def test_timestamps_do_not_jitter_between_scrapes() -> None:
    sas1 = listing(ike(1, child(1, "c0", 0, "INSTALLED", **{"rekey-time": "50"})))
    sas2 = listing(ike(1, child(1, "c0", 0, "INSTALLED", **{"rekey-time": "48"})) | {"established": "7"})
    c1, l1 = observe_listing(Carry(), sas1, epoch=E1, now=1000.2)
    c2, l2 = observe_listing(c1, sas2, epoch=E1, now=1002.9)  # charon's whole seconds vs our clock
    v1, v2 = view(c1, l1, [], epoch=E1), view(c2, l2, [], epoch=E1)
    assert v1.tunnels[0].next_rekey == v2.tunnels[0].next_rekey
    assert v1.tunnels[0].established == v2.tunnels[0].established


def test_up_needs_an_established_ike_sa_and_a_child_carrying_traffic() -> None:
    sas = listing(
        ike(1, child(1, state="REKEYING")),  # still the live SA until its successor is INSTALLED
        ike(2, child(2, name="c1", state="INSTALLING"), name="t2"),
        ike(3, name="t3", state="CONNECTING"),
    )
    carry, listed = observe_listing(Carry(), sas, epoch=E1, now=1.0)
    assert {t.name: t.up for t in view(carry, listed, [], epoch=E1).tunnels} == {
        "t1": True,
        "t2": False,
        "t3": False,
    }


def test_an_sa_retired_by_an_event_while_the_listing_streams_is_counted_once() -> None:
    """The event follower may fold a child-rekey between a listing's first event and its end: the
    listing is settled against the carry as it is at the end, so the old SA counts once."""
    carry, _ = observe_listing(Carry(), listing(ike(1, child(1, nbytes=100))), epoch=E1, now=1000.0)
    streaming = Listing(epoch=E1, now=1001.0, subnets=carry.subnets)
    streaming.add("t1", ike(1, child(1, nbytes=110)))  # listed while still live...
    carry = observe_event(  # ...then rekeyed: its final count is retired
        carry, "child-rekey", rekey_event(child(1, nbytes=120), child(2, nbytes=0)), epoch=E1, now=1001.5
    )
    carry, _ = streaming.finish(carry)
    assert totals(carry)[("t1", "c0")].bytes_in == 120
    carry, _ = observe_listing(carry, listing(ike(1, child(2, nbytes=30))), epoch=E1, now=1002.0)
    assert totals(carry)[("t1", "c0")].bytes_in == 150
