"""A gateway namespace whose PodSecurity level refuses the gateway pod (issue: the API server's own
rules): the API emulator refuses the pod as kube-apiserver does (lab.kubeapi.podsecurity, held to the
real server's words by the ``pod_security`` differential scenario), and the controller says so on the
gateway. The emulator runs no ReplicaSet controller and the lab kubelet, which plays it, writes no
``ReplicaFailure`` (docs/kubeapi.md): this test does the ReplicaSet controller's two steps - create a pod
from the Deployment's template, and on a refusal copy the error into the Deployment's ``ReplicaFailure``
(``FailedCreate``) as kube-controller-manager does."""

from __future__ import annotations

import re
from typing import Any

import pytest

from lab.cluster import Cluster, home_of
from lab.kubeapi.errors import ApiError
from lab.wait import wait_for
from tests.component.test_controller_operator import NS, apply_ipsec, cluster, start
from tests.component.test_controller_pod_ready import PODSECURITY, replica_failure_shows

__all__ = ["cluster"]  # the fixture


def test_a_namespace_that_refuses_the_gateway_pod_shows_on_the_gateway(cluster: Cluster) -> None:
    start(cluster)
    name, home = home_of("acme", NS)
    cluster.kube.patch(
        "v1", "Namespace", home, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    )
    apply_ipsec(cluster)
    deployment = wait_for(lambda: cluster.owned("apps/v1", "Deployment", "acme", NS), 30, "the Deployment")
    template = deployment["spec"]["template"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "generateName": f"{name}-6499579b5c-", "namespace": home},
        "spec": template["spec"],
    }
    with pytest.raises(ApiError) as refused:
        cluster.kube.create(pod)
    assert refused.value.code == 403
    message = refused.value.message
    # Word for word what kube-apiserver v1.35.4 answered the real ReplicaSet controller (captured), but
    # for the generated name's random end.
    assert re.sub(r"-6499579b5c-[a-z0-9]{5}\"", '-6499579b5c-rx7j5"', message, count=1) == PODSECURITY
    replica_failure_shows(cluster, name, home, message)
