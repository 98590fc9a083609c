"""The operator's gateway pod settings in any valid form (``0.5``, ``1024Mi``, ``0.1Gi``, a toleration with an
empty value) make no write at a no-op resync: the controller canonicalises them at start as the API server
stores them (quantities printed in canonical form, empty ``omitempty`` fields left out), so the Deployment
it compares with what it wants is the one it wrote. Against the emulator, which stores them the way
kube-apiserver does (lab.kubeapi.podspec); tests/integration/test_controller_quantities_real.py runs the
same against the real kube-apiserver."""

from __future__ import annotations

import re
import time
from typing import Any

from lab.cluster import Cluster, Controller
from lab.wait import wait_for
from tests.component.test_controller_operator import (
    CONFIG,
    NS,
    apply_ipsec,
    cluster,
    converged,
    gateway,
    metric,
    seq,
    writes,
)
from tests.helpers import condition

__all__ = ["cluster"]  # the fixture

GATEWAY_POD: dict[str, Any] = {
    "resources": {
        "charon": {
            "requests": {"cpu": 0.5, "memory": "1024Mi"},
            "limits": {"cpu": "1000m", "memory": "1.5Gi"},
        },
        "status-agent": {"requests": {"cpu": "0.05", "memory": "0.1Gi"}, "limits": {"memory": "256Mi"}},
    },
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "vpn", "effect": "NoSchedule"},
        {"key": "vpn.example.com/only", "operator": "Exists", "value": "", "effect": "NoExecute",
         "tolerationSeconds": 60},
        {"key": "", "operator": "Exists", "effect": "PreferNoSchedule"},
    ],
}  # fmt: skip
"""Valid settings the API server stores in another form (every value here is rewritten by it)."""
CANONICAL: dict[str, Any] = {
    "charon": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1536Mi"}},
    "status-agent": {"requests": {"cpu": "50m", "memory": "107374182400m"}, "limits": {"memory": "256Mi"}},
}
TOLERATIONS = [
    {"key": "dedicated", "operator": "Equal", "value": "vpn", "effect": "NoSchedule"},
    {"key": "vpn.example.com/only", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    {"operator": "Exists", "effect": "PreferNoSchedule"},
]
"""What a server stores for GATEWAY_POD's tolerations (after the pod's own two)."""
CONFIG_Q = {**CONFIG, "gatewayPod": GATEWAY_POD}


def reconciles(ctl: Controller) -> float:
    """Reconciles so far, whatever their result."""
    text = ctl.get("/metrics")[1]
    return sum(float(n) for n in re.findall(r"^vpngw_controller_reconcile_total\{[^}]*\} (\S+)$", text, re.M))


def api_writes(ctl: Controller) -> float:
    """The controller's own count of its API writes."""
    text = ctl.get("/metrics")[1]
    return sum(
        float(n) for n in re.findall(r"^vpngw_controller_api_writes_total\{[^}]*\} (\S+)$", text, re.M)
    )


def pod_shape(deployment: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """(container name -> resources, tolerations) of a Deployment's pod template."""
    spec = deployment["spec"]["template"]["spec"]
    return {c["name"]: c.get("resources") for c in spec["containers"]}, spec["tolerations"]


def test_settings_in_any_valid_form_make_no_write_at_a_resync(cluster: Cluster) -> None:
    ctl = cluster.start_controller(CONFIG_Q, "--resync-seconds", "10")
    wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 30, "the controller to be ready")
    assert ctl.proc.poll() is None, ctl.log()
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    wait_for(lambda: condition(gateway(cluster), "Ready"), 10, "a status")
    dep = cluster.owned("apps/v1", "Deployment", "acme", NS)
    assert dep is not None
    resources, tolerations = pod_shape(dep)
    assert resources["charon"] == CANONICAL["charon"], "the emulator stores canonical quantities"
    assert resources["status-agent"] == CANONICAL["status-agent"]
    assert tolerations[2:] == TOLERATIONS

    def settled() -> bool:
        """The set-up's writes are done: every write the API accepted from the controller is one it
        counted (the reconcile that made it has returned), and nothing waits in its queue."""
        logged = sum(1 for r in writes(cluster, 0) if r.user_agent == "vpngw-controller" and r.code < 400)
        return api_writes(ctl) == logged and metric(ctl, "vpngw_controller_queue_depth") == 0

    wait_for(settled, 10, "the controller to settle")
    mark, done, wrote = seq(cluster), reconciles(ctl), api_writes(ctl)
    time.sleep(12)  # at least one full resync (every 10 s)
    assert reconciles(ctl) > done, "a resync reconciled the gateway in the window"
    assert writes(cluster, mark) == [], ctl.log()[-3000:]
    assert api_writes(ctl) == wrote


def test_settings_the_server_would_refuse_stop_the_controller_at_start_naming_the_field_and_the_rule(
    cluster: Cluster,
) -> None:
    over = {"charon": {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}}
    ctl = cluster.start_controller({**CONFIG, "gatewayPod": {"resources": over}}, name="over")
    assert ctl.proc.wait(30) == 2
    assert (
        "config.gatewayPod.resources.charon.requests.memory: 1Gi is more than its limit 512Mi (the API "
        "server refuses a request above its limit: ValidateResourceRequirements)"
    ) in ctl.log()
    bad = {"tolerations": [{"operator": "Equal", "value": "vpn"}]}
    ctl2 = cluster.start_controller({**CONFIG, "gatewayPod": bad}, name="tolerations")
    assert ctl2.proc.wait(30) == 2
    assert "config.gatewayPod.tolerations[0].operator: must be Exists when key is empty" in ctl2.log()
