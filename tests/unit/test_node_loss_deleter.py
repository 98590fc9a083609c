"""Who force-deleted the old pod in the node-loss test (tests/integration/test_real_node_loss_e2e.py): the
controller (its PodForceDeleted Event) or kube-controller-manager's pod GC (its log line), never both."""

from __future__ import annotations

import pytest

from tests.integration.test_real_kubelet import GATEWAY
from tests.integration.test_real_node_loss_e2e import force_deleter, podgc_tried

PODGC = (
    'I1203 07:02:38.862031   26149 gc_controller.go:348] "PodGC is force deleting Pod" '
    'controller="pod-garbage-collector-controller" pod="home/gw-abc-x1"\n'
)
OTHER = 'I1203 07:02:38.862031   26149 taint_eviction.go:111] "Deleting pod" pod="home/gw-abc-x1"\n'
EVENT = {
    "involvedObject": {"name": GATEWAY},
    "message": "pod gw-abc-x1: node node-a is gone or out of service",
}


def test_the_controllers_event_means_it_won_even_when_podgc_tried_too() -> None:
    assert force_deleter([EVENT], PODGC, "home", "gw-abc-x1") == "controller"
    assert force_deleter([EVENT], "", "home", "gw-abc-x1") == "controller"


def test_no_event_means_podgc_which_its_log_must_show() -> None:
    assert force_deleter([], OTHER + PODGC, "home", "gw-abc-x1") == "podgc"
    with pytest.raises(AssertionError, match="no PodForceDeleted Event"):
        force_deleter([], OTHER, "home", "gw-abc-x1")
    assert not podgc_tried(PODGC, "home", "gw-abc-x2"), "another pod's line"


def test_two_events_or_a_wrong_one_fail() -> None:
    with pytest.raises(AssertionError, match="more than one"):
        force_deleter([EVENT, EVENT], "", "home", "gw-abc-x1")
    with pytest.raises(AssertionError):
        force_deleter([{**EVENT, "message": "pod gw-abc-x1: fenced"}], "", "home", "gw-abc-x1")
