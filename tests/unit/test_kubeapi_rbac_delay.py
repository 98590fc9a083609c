"""The API emulator's RBAC delay (lab.kubeapi.rbac.LaggingCache): the authorizer sees a Role or binding
change only ``delay`` seconds after it, as kube-apiserver's RBAC authorizer sees it once its informers
have it; the initial list at once."""

from __future__ import annotations

from typing import Any

from lab.kubeapi.rbac import LaggingCache


def _role(name: str, verbs: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "t"}, "rules": [{"verbs": verbs}]}


def test_a_change_is_seen_after_the_delay_and_in_order() -> None:
    cache = LaggingCache(2.0)
    cache.offer(0.0, "roles", "ADDED", _role("old", ["get"]), synced=True)
    assert set(cache.snapshot(0.0).roles) == {("t", "old")}
    cache.offer(10.0, "roles", "ADDED", _role("new", ["get"]))
    cache.offer(10.5, "roles", "MODIFIED", _role("new", ["get", "patch"]))
    cache.offer(11.0, "roles", "DELETED", _role("old", ["get"]))
    assert set(cache.snapshot(11.9).roles) == {("t", "old")}
    seen = cache.snapshot(12.0).roles
    assert set(seen) == {("t", "old"), ("t", "new")} and seen[("t", "new")]["rules"] == [{"verbs": ["get"]}]
    assert cache.snapshot(12.5).roles[("t", "new")]["rules"] == [{"verbs": ["get", "patch"]}]
    assert set(cache.snapshot(13.0).roles) == {("t", "new")}


def test_each_kind_lands_in_its_place() -> None:
    cache = LaggingCache(0.5)
    binding = {"metadata": {"name": "b", "namespace": "t"}, "roleRef": {"kind": "Role", "name": "r"}}
    cache.offer(0.0, "rolebindings", "ADDED", binding)
    cache.offer(0.0, "clusterroles", "ADDED", {"metadata": {"name": "c"}, "rules": []})
    assert not cache.snapshot(0.4).role_bindings
    snap = cache.snapshot(0.5)
    assert list(snap.role_bindings) == [binding] and set(snap.cluster_roles) == {"c"}
