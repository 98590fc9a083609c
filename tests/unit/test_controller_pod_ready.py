"""A gateway pod that cannot be created (the Deployment's ``ReplicaFailure``) or that the kubelet rejected
says why in ``PodReady`` (issue 21, item 5). Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from controller.reconcile import Decision
from tests.component.test_controller_pod_ready import PODSECURITY
from tests.unit.test_controller_desired import IPSEC, applied, run, snapshot


def conds(status: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def deployment_with(conditions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    owned = applied(run(snapshot(IPSEC)))
    owned["Deployment"]["status"] = {"replicas": 0, "conditions": conditions}
    return owned


def pod_ready(d: Decision) -> dict[str, Any]:
    return conds(d.status)["PodReady"]


def test_a_pod_the_replicaset_controller_cannot_create_says_why() -> None:
    failure = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": PODSECURITY,
    }
    progressing = {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated", "message": "x"}
    d = run(snapshot(IPSEC, owned=deployment_with([progressing, failure])))
    c = pod_ready(d)
    assert c["status"] == "False" and c["reason"] == "FailedCreate"
    assert c["message"] == f"the gateway pod cannot be created: {PODSECURITY}"
    # Once the Deployment controller removes the condition (a pod could be created), it is gone.
    d = run(snapshot(IPSEC, owned=deployment_with([progressing])))
    assert pod_ready(d)["reason"] == "NoPod"
    # A ReplicaFailure that is no longer True says nothing either.
    d = run(snapshot(IPSEC, owned=deployment_with([progressing, {**failure, "status": "False"}])))
    assert pod_ready(d)["reason"] == "NoPod"


def test_a_pod_the_kubelet_rejected_says_why() -> None:
    rejected = {
        "metadata": {"name": "p", "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"nodeName": "node-a"},
        "status": {
            "phase": "Failed",
            "reason": "SysctlForbidden",
            "message": 'Pod was rejected: forbidden sysctl: "net.ipv4.ip_forward" not allowlisted',
        },
    }
    d = run(dataclasses.replace(snapshot(IPSEC), pods=(rejected,)))
    c = pod_ready(d)
    assert c["reason"] == "PodNotReady"
    assert c["message"] == (
        'pod p is Failed: SysctlForbidden: Pod was rejected: forbidden sysctl: "net.ipv4.ip_forward" not '
        "allowlisted"
    )
