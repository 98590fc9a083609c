"""Placement (sticky, re-pin, cap, selector, taints, cordon), the subset comparison behind "in order", and
the work queue's guarantees (one key at most once, never two workers, backoff)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from controller.diff import covers, replacement
from controller.placement import place
from controller.workqueue import WorkQueue


def node(
    name: str,
    *,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    cordoned: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def where(
    current: str | None, nodes: list[dict[str, Any]], pinned: dict[str, int] | None = None, **kw: Any
) -> tuple[str | None, str]:
    p = place(
        current,
        nodes,
        pinned or {},
        selector=kw.get("selector", {}),
        tolerations=kw.get("tolerations", []),
        cap=kw.get("cap", 0),
    )
    return p.node, p.reason


@pytest.mark.parametrize(
    "current, nodes, pinned, kw, expected",
    [
        pytest.param(None, [node("b"), node("a")], {}, {}, ("a", "Placed"), id="fewest-then-name"),
        pytest.param(
            None, [node("a"), node("b")], {"a": 2, "b": 1}, {}, ("b", "Placed"), id="fewest-gateways"
        ),
        pytest.param(
            "b", [node("a"), node("b")], {"b": 5}, {}, ("b", "Pinned"), id="sticky-even-when-busier"
        ),
        pytest.param(
            "b", [node("a"), node("b", ready=False)], {}, {}, ("a", "Repinned"), id="not-ready-repins"
        ),
        pytest.param("gone", [node("a")], {}, {}, ("a", "Repinned"), id="deleted-node-repins"),
        pytest.param("b", [node("a"), node("b", cordoned=True)], {}, {}, ("b", "Pinned"), id="cordon-keeps"),
        pytest.param(
            None, [node("a", cordoned=True), node("b")], {}, {}, ("b", "Placed"), id="cordon-takes-none"
        ),
        pytest.param(
            None, [node("a"), node("b")], {"a": 1}, {"cap": 1}, ("b", "Placed"), id="full-node-skipped"
        ),
        pytest.param(None, [node("a")], {"a": 1}, {"cap": 1}, (None, "NoSchedulableNode"), id="all-full"),
        pytest.param(
            None,
            [node("a"), node("b", labels={"pool": "vpn"})],
            {},
            {"selector": {"pool": "vpn"}},
            ("b", "Placed"),
            id="selector",
        ),
        pytest.param(
            "a",
            [node("a"), node("b", labels={"pool": "vpn"})],
            {},
            {"selector": {"pool": "vpn"}},
            ("b", "Repinned"),
            id="selector-change-repins",
        ),
        pytest.param(
            None,
            [node("a", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]), node("b")],
            {},
            {},
            ("b", "Placed"),
            id="untolerated-taint",
        ),
        pytest.param(
            None,
            [node("a", taints=[{"key": "dedicated", "value": "vpn", "effect": "NoSchedule"}])],
            {},
            {
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "vpn", "effect": "NoSchedule"}
                ]
            },
            ("a", "Placed"),
            id="tolerated-taint",
        ),
        pytest.param(None, [node("a", ready=False)], {}, {}, (None, "NoSchedulableNode"), id="none-ready"),
    ],
)
def test_placement(
    current: str | None,
    nodes: list[dict[str, Any]],
    pinned: dict[str, int],
    kw: dict[str, Any],
    expected: tuple[str | None, str],
) -> None:
    assert where(current, nodes, pinned, **kw) == expected


def test_no_node_says_what_it_looked_at() -> None:
    p = place(None, [node("a")], {"a": 3}, selector={"pool": "vpn"}, tolerations=[], cap=3)
    assert (
        p.message
        == "no Ready node can take the gateway (1 node(s); cap 3 gateway(s) per node; selector pool=vpn)"
    )


@pytest.mark.parametrize(
    "actual, want, ok",
    [
        pytest.param({"a": 1, "b": 2}, {"a": 1}, True, id="extra-fields-are-others"),
        pytest.param({"a": 1}, {"a": 2}, False, id="changed-value"),
        pytest.param({"a": [1, 2]}, {"a": [1]}, False, id="longer-list"),
        pytest.param({"a": [{"x": 1, "d": 0}]}, {"a": [{"x": 1}]}, True, id="defaulted-item-field"),
        pytest.param({"a": True}, {"a": 1}, False, id="bool-is-not-int"),
        pytest.param({}, {"a": None}, False, id="missing"),
    ],
)
def test_covers(actual: Any, want: Any, ok: bool) -> None:
    assert covers(actual, want) is ok


def test_replacement_keeps_others_metadata_and_fields_and_takes_ours() -> None:
    actual = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "x",
            "resourceVersion": "9",
            "labels": {"a": "theirs", "b": "old"},
            "finalizers": ["f"],
            "managedFields": [{}],
        },
        "secrets": [{"name": "token"}],
        "automountServiceAccountToken": False,
    }
    want = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "x", "labels": {"b": "ours"}},
        "automountServiceAccountToken": True,
    }
    out = replacement(actual, want)
    assert out["metadata"]["labels"] == {"a": "theirs", "b": "ours"}
    assert out["metadata"]["resourceVersion"] == "9" and out["metadata"]["finalizers"] == ["f"]
    assert "managedFields" not in out["metadata"]
    assert out["secrets"] == [{"name": "token"}] and out["automountServiceAccountToken"] is True


@pytest.mark.anyio
async def test_a_key_is_queued_once_and_never_given_to_two_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    for _ in range(3):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    first = await q.get()
    assert first == "a"
    q.add("a")  # changed again while being processed
    assert len(q) == 1, "parked, not queued a second time"
    assert await q.get() == "b"
    q.done("a")
    assert len(q) == 1, "queued again once the first worker is done"
    assert await q.get() == "a"


@pytest.mark.anyio
async def test_retry_backs_off_per_key_and_forget_resets_it() -> None:
    now = [0.0]
    q: WorkQueue[str] = WorkQueue(base=0.5, cap=4.0, clock=lambda: now[0])
    delays = [q.retry("a") for _ in range(5)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    q.forget("a")
    assert q.retry("a") == 0.5
    q2: WorkQueue[str] = WorkQueue(base=0.05, cap=0.05)
    q2.add_after("late", 0.05)
    assert len(q2) == 0
    with anyio.fail_after(2):
        assert await q2.get() == "late"


@pytest.mark.anyio
async def test_a_change_goes_before_the_resyncs_keys_and_a_resynced_key_that_changes_moves_up() -> None:
    q: WorkQueue[str] = WorkQueue()
    for k in ("r1", "r2", "r3"):
        q.add(k, background=True)
    q.add("edit")
    q.add("r3")  # changed while waiting behind the resync
    assert len(q) == 4
    assert [await q.get() for _ in range(4)] == ["edit", "r3", "r1", "r2"]
