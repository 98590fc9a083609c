"""A mutating admission webhook that adds its own things to the gateway pod's template (a sidecar and its
volume, a toleration, an env var in every container, a label, an annotation: Istio, Kyverno, a proxy
injector) must not make the controller rewrite the Deployment: a resync writes nothing (issue 21, item 6).
The emulator's mutating hook stands in for the webhook (kube-apiserver's order: defaulting, mutating
admission, validation)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster import Cluster, wait_for
from tests.component.test_controller_operator import (
    CONFIG,
    apply_ipsec,
    condition,
    converged,
    gateway,
    metric,
    seq,
    writes,
)


def inject(key: tuple[str, str], obj: dict[str, Any]) -> None:
    """What the webhook does to every Deployment it sees (idempotent, as webhooks are)."""
    if key != ("apps", "deployments"):
        return
    template = obj["spec"]["template"]
    template["metadata"].setdefault("labels", {})["sidecar.example/injected"] = "true"
    template["metadata"].setdefault("annotations", {})["sidecar.example/status"] = "injected"
    pod = template["spec"]
    for c in pod["containers"]:
        env = c.setdefault("env", [])
        if not any(e["name"] == "HTTPS_PROXY" for e in env):
            env.append({"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"})
    if not any(c["name"] == "sidecar" for c in pod["containers"]):
        pod["containers"].append(
            {
                "name": "sidecar",
                "image": "sidecar.example/proxy:1",
                "volumeMounts": [{"name": "sidecar-certs", "mountPath": "/certs"}],
            }
        )
    volumes = pod.setdefault("volumes", [])
    if not any(v["name"] == "sidecar-certs" for v in volumes):
        volumes.append({"name": "sidecar-certs", "emptyDir": {}})
    tolerations = pod.setdefault("tolerations", [])
    extra = {"key": "sidecar.example/any", "operator": "Exists", "effect": "NoSchedule"}
    if extra not in tolerations:
        tolerations.append(extra)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.add_node("node-a")
        c.kube.add_mutator(inject)
        yield c


def test_a_webhooks_sidecar_toleration_and_env_cause_no_rewrite(cluster: Cluster) -> None:
    ctl = cluster.start_controller(CONFIG, "--resync-seconds", "10")
    wait_for(ctl.ready, 30, "ready")
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "the gateway's objects")
    deployment = cluster.owned("apps/v1", "Deployment", "acme", "tenant-acme")
    assert deployment is not None
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert "sidecar" in names, "the webhook ran"

    def settled() -> bool:
        """Every write the emulator logged from the controller was counted by a reconcile that returned,
        the gateway has its status, and nothing waits in the queue."""
        logged = sum(1 for r in writes(cluster, 0) if r.user_agent == "vpngw-controller")
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
    # Our own containers are still checked: one taken out is restored, the sidecar kept.
    kept = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] != "charon"]
    md = deployment["metadata"]
    patch = {"spec": {"template": {"spec": {"containers": kept}}}}
    cluster.kube.patch("apps/v1", "Deployment", md["name"], patch, md["namespace"])
    wait_for(
        lambda: (
            "charon"
            in [
                c["name"]
                for c in (cluster.owned("apps/v1", "Deployment", "acme", "tenant-acme") or {})["spec"][
                    "template"
                ]["spec"]["containers"]
            ]
        ),
        20,
        "charon restored",
    )
