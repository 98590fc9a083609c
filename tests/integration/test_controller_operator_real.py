"""The operator's tests (tests/component/test_controller_operator.py) against the REAL control plane
(kube-apiserver and kube-controller-manager, lab.controlplane): the same test bodies, with a ``cluster``
that is ``lab.controlplane.operated.RealCluster``: two heart-beating nodes (``NodeAgent``; NotReady is
what their kubelet posts), the controller as the admin through the fault proxy, every namespace and node
named for the test (the control plane is the session's). The real ReplicaSet controller makes the gateway
pods (no kubelet runs them).

The tests that exercise the real server's semantics run here (its validation and defaults, the
ReplicaSet controller's pods, Node conditions, Events, status-subresource merge patches racing the
controller's, the Lease API, the CRDs' printer columns through kubectl); the other portable ones pass here
too but stay emulator-only for time, and some need the emulator's powers: docs/kubeapi.md, "What runs
against what".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.controlplane import ControlPlane
from lab.controlplane.operated import RealCluster
from tests.component import test_controller_operator as operator
from tests.component.test_controller_operator import (
    test_a_gateway_in_a_namespace_not_enabled_takes_no_node_and_no_cloud_until_enabled,
    test_a_gateway_is_reconciled_into_its_objects_status_and_finalizer,
    test_a_grant_revoked_rewrites_the_plan_and_leaves_the_deployment_alone,
    test_a_node_that_goes_not_ready_repins_its_gateway_promptly,
    test_a_stopped_leader_hands_its_lease_over_at_once,
    test_kubectl_apply_of_the_example_then_get_vpngateways_shows_the_columns,
    test_the_controllers_and_the_agents_status_writes_do_not_clobber_each_other,
)

__all__ = [  # the emulator's tests, collected here again with this module's ``cluster``
    "test_a_gateway_in_a_namespace_not_enabled_takes_no_node_and_no_cloud_until_enabled",
    "test_a_gateway_is_reconciled_into_its_objects_status_and_finalizer",
    "test_a_grant_revoked_rewrites_the_plan_and_leaves_the_deployment_alone",
    "test_a_node_that_goes_not_ready_repins_its_gateway_promptly",
    "test_a_stopped_leader_hands_its_lease_over_at_once",
    "test_kubectl_apply_of_the_example_then_get_vpngateways_shows_the_columns",
    "test_the_controllers_and_the_agents_status_writes_do_not_clobber_each_other",
]

pytestmark = pytest.mark.lab

_TAGS = itertools.count(1)


@pytest.fixture
def cluster(controlplane: ControlPlane, tmp_path: Path) -> Iterator[RealCluster]:
    """The component module's two nodes (node-a, node-b with their OpenStack providerIDs) on the real
    control plane, in this test's spelling; the controllers' logs shown with a failed test's report (the
    controller logs no secrets)."""
    with RealCluster(controlplane, tmp_path, tag=f"op{next(_TAGS)}") as c:
        c.add_node(c.unique("node-a"), provider_id="openstack:///11111111-1111-4111-8111-111111111111")
        c.add_node(c.unique("node-b"), provider_id="openstack:///22222222-2222-4222-8222-222222222222")
        try:
            yield c
        finally:
            for ctl in c.controllers:
                print(f"--- {ctl.log_path.name} (tail)\n{ctl.log()[-6000:]}")


def test_an_owned_deployment_deleted_or_edited_is_restored(cluster: RealCluster) -> None:
    """The Deployment of the emulator's parametrized test (the other six kinds stay emulator-only: the same
    machinery): the real Deployment and ReplicaSet controllers act on it meanwhile, and the real
    validation refuses what no edit can do."""
    operator.test_an_owned_object_deleted_or_edited_is_restored(cluster, "apps/v1", "Deployment")
