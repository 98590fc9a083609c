"""A gateway pod that cannot be created says why (issue 21, item 5): the controller as a process against
the API emulator (the same world as tests/component/test_controller_operator.py). The Deployment's
``ReplicaFailure`` is written as kube-controller-manager writes it, in its words as captured from the real
control plane: the emulator runs no Deployment or ReplicaSet controller (docs/kubeapi.md), so no rule is
added to it; tests/integration/test_status_truth_real.py has the real ReplicaSet controller refused by
PodSecurity.
"""

from __future__ import annotations

from typing import Any

from controller.names import GatewayKey
from lab.cluster import Cluster, home_of
from lab.wait import wait_for
from tests.component.test_controller_operator import NS, apply_ipsec, cluster, gateway, start
from tests.helpers import condition

__all__ = ["cluster"]  # the fixture

HOME = GatewayKey("VPNGateway", NS, "acme").home_name
# The real server's PodSecurity refusal, as the Deployment controller copies it from the ReplicaSet's
# FailedCreate (captured from kube-controller-manager v1.35 by tests/integration/test_status_truth_real.py).
PODSECURITY = (
    f'pods "{HOME}-6499579b5c-rx7j5" is forbidden: violates PodSecurity "baseline:latest": non-default '
    'capabilities (containers "init-nat", "init-nat-watch", "charon" must not include "NET_ADMIN", '
    '"NET_RAW" in securityContext.capabilities.add), forbidden sysctls (net.ipv4.ip_forward, '
    "net.ipv4.conf.all.rp_filter)"
)


def replica_failure_shows(cluster: Cluster, name: str, home: str, message: str) -> None:
    """The Deployment's ReplicaFailure, written as kube-controller-manager writes it, reaches the
    gateway's PodReady with its message."""
    failure = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": message,
        "lastUpdateTime": "2026-12-01T10:00:00Z",
        "lastTransitionTime": "2026-12-01T10:00:00Z",
    }
    cluster.kube.patch(
        "apps/v1", "Deployment", name, {"status": {"conditions": [failure]}}, home, subresource="status"
    )

    def pod_ready() -> dict[str, Any] | None:
        c = condition(gateway(cluster), "PodReady")
        return c if c and c["reason"] == "FailedCreate" else None

    c = wait_for(pod_ready, 20, "PodReady saying why the pod cannot be created")
    assert c["status"] == "False" and c["message"] == f"the gateway pod cannot be created: {message}"


def test_a_pod_that_cannot_be_created_says_why(cluster: Cluster) -> None:
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: cluster.owned("apps/v1", "Deployment", "acme", NS), 30, "the Deployment")
    wait_for(lambda: condition(gateway(cluster), "PodReady").get("reason") == "NoPod", 30, "NoPod")
    name, home = home_of("acme", NS)
    replica_failure_shows(cluster, name, home, PODSECURITY)
    cluster.kube.patch(
        "apps/v1", "Deployment", name, {"status": {"conditions": []}}, home, subresource="status"
    )
    wait_for(lambda: condition(gateway(cluster), "PodReady").get("reason") == "NoPod", 20, "NoPod again")
