"""A mutating admission webhook that adds its own label, annotation, toleration and pull secret to the
gateway pod's template (a policy engine, a registry mirror) must not make the controller rewrite the
Deployment: a resync writes nothing (issue 21, item 6). A sidecar someone adds is restored away: the pod
holds NET_ADMIN, NIC2 and the tunnels' keys. The emulator's mutating hook stands in for the webhook
(kube-apiserver's order: defaulting, mutating admission, validation)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster import Cluster
from lab.wait import wait_for
from tests.component.test_controller_operator import (
    CONFIG,
    apply_ipsec,
    converged,
    gateway,
    metric,
    seq,
    writes,
)
from tests.helpers import condition


def inject(key: tuple[str, str], obj: dict[str, Any]) -> None:
    """What a policy webhook does to every Deployment it sees (idempotent, as webhooks are)."""
    if key != ("apps", "deployments"):
        return
    template = obj["spec"]["template"]
    template["metadata"].setdefault("labels", {})["policy.example/checked"] = "true"
    template["metadata"].setdefault("annotations", {})["policy.example/status"] = "mutated"
    pod = template["spec"]
    tolerations = pod.setdefault("tolerations", [])
    if TOLERATION not in tolerations:
        tolerations.append(TOLERATION)
    secrets = pod.setdefault("imagePullSecrets", [])
    if {"name": "mirror"} not in secrets:
        secrets.append({"name": "mirror"})


TOLERATION = {"key": "policy.example/any", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.add_node("node-a")
        c.kube.add_mutator(inject)
        yield c


def test_a_webhooks_toleration_and_pull_secret_cause_no_rewrite_and_a_sidecar_goes(cluster: Cluster) -> None:
    ctl = cluster.start_controller(CONFIG, "--resync-seconds", "10")
    wait_for(ctl.ready, 30, "ready")
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "the gateway's objects")
    deployment = cluster.owned("apps/v1", "Deployment", "acme", "tenant-acme")
    assert deployment is not None
    assert TOLERATION in deployment["spec"]["template"]["spec"]["tolerations"], "the webhook ran"

    def settled() -> bool:
        """Every write the API accepted from the controller was counted by a reconcile that returned (a
        status patch refused as stale, 409, is decided again),
        the gateway has its status, and nothing waits in the queue."""
        logged = sum(1 for r in writes(cluster, 0) if r.user_agent == "vpngw-controller" and r.code < 400)
        return (
            bool(condition(gateway(cluster), "Ready"))
            and metric(ctl, "vpngw_controller_api_writes_total") == logged
            and metric(ctl, "vpngw_controller_queue_depth") == 0
        )

    wait_for(settled, 20, "the controller to settle")
    mark = seq(cluster)
    before = metric(ctl, "vpngw_controller_reconcile_total")
    wait_for(lambda: metric(ctl, "vpngw_controller_reconcile_total") >= before + 1, 25, "a resync")
    rewrites = [(r.verb, r.resource, r.name) for r in writes(cluster, mark)]
    assert rewrites == [], f"the webhook's additions made the controller write: {rewrites}"
    # A sidecar someone added is restored away; the webhook's toleration stays.
    containers = [*deployment["spec"]["template"]["spec"]["containers"], {"name": "sidecar", "image": "x:1"}]
    md = deployment["metadata"]
    patch = {"spec": {"template": {"spec": {"containers": containers}}}}
    cluster.kube.patch("apps/v1", "Deployment", md["name"], patch, md["namespace"])

    def pod_spec() -> dict[str, Any]:
        dep = cluster.owned("apps/v1", "Deployment", "acme", "tenant-acme") or {}
        return dict(dep["spec"]["template"]["spec"])

    wait_for(lambda: all(c["name"] != "sidecar" for c in pod_spec()["containers"]), 20, "the sidecar gone")
    assert TOLERATION in pod_spec()["tolerations"]
