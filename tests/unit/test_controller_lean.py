"""What the controller's caches keep of objects others write (``controller.informer.lean``)."""

from __future__ import annotations

import copy
from typing import Any

from controller.informer import LAST_APPLIED, lean
from controller.run import status_only


def test_managed_fields_and_the_last_applied_copy_are_dropped_and_nothing_else() -> None:
    obj = {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNPeer",
        "metadata": {
            "name": "s1",
            "resourceVersion": "7",
            "annotations": {LAST_APPLIED: '{"spec": "..."}', "team": "net"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"type": "site"},
    }
    before = copy.deepcopy(obj)
    got = lean(obj)
    assert got["metadata"] == {"name": "s1", "resourceVersion": "7", "annotations": {"team": "net"}}
    assert got["spec"] == obj["spec"]
    assert obj == before, "the informer's input is not changed in place"
    plain = {"metadata": {"name": "x"}}
    assert lean(plain) is plain


def test_a_status_write_alone_is_no_reason_to_reconcile() -> None:
    """The agents republish status (counters) every ~30 s per gateway, and each reconcile asks the cloud:
    found by review, status writes drove full reconciles. Only status and the resourceVersion moved: no."""
    before: dict[str, Any] = {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNGateway",
        "metadata": {"name": "acme", "generation": 2, "resourceVersion": "10", "labels": {"a": "b"}},
        "spec": {"serviceCIDR": "198.18.0.0/24"},
        "status": {"tunnels": [{"name": "s1", "bytesIn": 1}]},
    }
    counters = {
        **before,
        "metadata": {**before["metadata"], "resourceVersion": "11"},
        "status": {"tunnels": []},
    }
    assert status_only(before, counters)
    for changed in (
        {**counters, "spec": {"serviceCIDR": "198.18.1.0/24"}},
        {**counters, "metadata": {**counters["metadata"], "labels": {}}},
        {**counters, "metadata": {**counters["metadata"], "finalizers": ["vpn.bnerd.net/cleanup"]}},
        {**counters, "metadata": {**counters["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}},
    ):
        assert not status_only(before, changed)
