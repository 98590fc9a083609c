"""What the controller's caches keep of objects others write (``controller.informer.lean``)."""

from __future__ import annotations

import copy

from controller.informer import LAST_APPLIED, lean


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
