"""Which pods of a gateway on a dead node the controller deletes without a kubelet (placement.stranded)."""

from __future__ import annotations

from typing import Any

from controller.placement import OUT_OF_SERVICE, stranded


def node(name: str, ready: bool, *taints: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"taints": [{"key": t, "effect": "NoExecute"} for t in taints]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]},
    }


def pod(name: str, on: str | None, deleting: bool = True) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "gw"}
    if deleting:  # the Recreate rollout deleted it; no kubelet confirms
        md["deletionTimestamp"] = "2026-12-02T18:00:00Z"
    return {"metadata": md, "spec": {"nodeName": on} if on else {}}


OLD, NEW = pod("old", "node-a"), pod("new", "node-b", deleting=False)


def names(pods: list[Any]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_a_fenced_pod_on_a_not_ready_node_goes_and_the_pinned_one_stays() -> None:
    nodes = [node("node-a", False), node("node-b", True)]
    assert names(stranded([OLD, NEW], nodes, "node-b", fenced=True)) == ["old"]


def test_without_a_fence_a_not_ready_node_may_still_serve_so_its_pod_waits() -> None:
    nodes = [node("node-a", False, "node.kubernetes.io/unreachable"), node("node-b", True)]
    assert stranded([OLD, NEW], nodes, "node-b", fenced=False) == []


def test_without_a_fence_an_out_of_service_or_gone_node_releases_its_pod() -> None:
    tainted = [node("node-a", False, OUT_OF_SERVICE), node("node-b", True)]
    assert names(stranded([OLD], tainted, "node-b", fenced=False)) == ["old"]
    assert names(stranded([OLD], [node("node-b", True)], "node-b", fenced=False)) == ["old"]


def test_a_ready_node_keeps_its_pod_and_nothing_goes_without_a_pin() -> None:
    # A Ready node's kubelet confirms the deletion itself (a re-pin for another reason: a selector change).
    assert stranded([OLD], [node("node-a", True, OUT_OF_SERVICE)], "node-b", fenced=True) == []
    assert stranded([OLD], [node("node-a", False)], None, fenced=True) == []
    assert stranded([pod("pending", None)], [], "node-b", fenced=True) == []


def test_a_pod_the_rollout_has_not_deleted_yet_stays() -> None:
    """Gone before the old ReplicaSet is scaled to 0, the ReplicaSet would make it again on the dead node."""
    nodes = [node("node-a", False, OUT_OF_SERVICE), node("node-b", True)]
    assert stranded([pod("old", "node-a", deleting=False)], nodes, "node-b", fenced=True) == []
