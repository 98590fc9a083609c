"""The controller's warm-standby HA (docs/ha.md) against the API emulator, with the static cloud (slot b's
NIC2 is the ``staticNICs`` entry ``namespace/name#b``): the pair's objects on two nodes, the Lease, the
plans' ``ha`` section, ``status.ha`` and ``StandbyReady`` following the Lease's holder, a failover only
once the previous holder's Lease expired by the controller's own clock (a release at once), HA turned
off, and a gateway asking for HA where the operator does not allow it.

The emulator runs no ReplicaSet controller and no kubelet: the tests create the pods the ReplicaSets
would (the Deployment's template labels, its node) and write their Ready status and the Lease's holder as
the kubelet and the agents would. What the agents and the cloud do on a failover is tested with them
(tests/component/test_agent_ha.py, tests/integration/test_ha_ipsec.py,
tests/integration/test_controller_openstack_ha.py)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.desired import plan_of
from controller.names import LABEL_HA_SLOT
from lab.cluster import GATEWAY_NAMESPACE, Cluster, Controller, home_of
from lab.kubeapi.errors import ApiError
from lab.wait import wait_for
from tests.component.test_controller_operator import (
    NIC,
    NS,
    VPN,
    apply_with_secrets,
    cluster,
    config_for,
    in_namespace,
    metric,
    start,
)
from tests.examples import example_docs
from tests.helpers import condition

__all__ = ["cluster"]  # the operator module's fixture

NIC_B = {"mac": "fa:16:3e:00:00:0b", "address": "192.0.2.3/26", "gateway": "192.0.2.1"}
COORD = "coordination.k8s.io/v1"


def ha_config(c: Cluster) -> dict[str, Any]:
    cfg = config_for(c)
    return {**cfg, "staticNICs": {**cfg["staticNICs"], f"{NS}/acme#b": NIC_B}}


def apply_ha(c: Cluster, enabled: bool = True) -> None:
    docs = in_namespace(example_docs("ipsec.yaml"), NS)
    for d in docs:
        if d["kind"] == "VPNGateway":
            d["spec"]["ha"] = {"enabled": enabled}
    apply_with_secrets(c, docs)


def gw(c: Cluster) -> dict[str, Any]:
    obj = c.get(VPN, "VPNGateway", "acme", NS)
    assert obj is not None
    return obj


def home(c: Cluster, kind: str, slot: str = "a", api: str = "apps/v1") -> dict[str, Any] | None:
    name, ns = home_of("acme", NS)
    return c.get(api, kind, name if slot == "a" else f"{name}-b", ns)


def node_of(dep: dict[str, Any] | None) -> str | None:
    return None if dep is None else dep["spec"]["template"]["spec"]["nodeName"]


def run_pod(c: Cluster, slot: str, suffix: str = "1") -> str:
    """The pod slot ``slot``'s ReplicaSet would make, Ready on its Deployment's node (its kubelet's word)."""
    dep = home(c, "Deployment", slot)
    assert dep is not None
    name = f"{dep['metadata']['name']}-{suffix}"
    labels = copy.deepcopy(dep["spec"]["template"]["metadata"]["labels"])
    c.kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": GATEWAY_NAMESPACE, "labels": labels},
            "spec": {
                "nodeName": node_of(dep),
                "containers": [{"name": "status-agent", "image": "localhost/vpngw-gateway:test"}],
            },
        }
    )
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    c.kube.patch("v1", "Pod", name, {"status": ready}, GATEWAY_NAMESPACE, subresource="status")
    return name


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def hold(c: Cluster, holder: str) -> None:
    """What the holder's agent writes (agent.election): the holder and a renewal; "" releases."""
    name, ns = home_of("acme", NS)
    spec: dict[str, Any] = {"holderIdentity": holder or None, "renewTime": micro_now()}
    if holder:
        spec["acquireTime"] = micro_now()
    c.kube.patch(COORD, "Lease", name, {"spec": spec}, ns)


class Renewer:
    """Stands in for the holding pod's agent (agent.election renews every renewSeconds, 1 s by default):
    renews the Lease for ``holder`` every 0.5 s until told another holder, or none (a killed agent: the
    holder stays, its renewals stop)."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.holder: str | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def set(self, holder: str | None) -> None:
        with self.lock:
            self.holder = holder
            if holder is not None:
                hold(self.c, holder)

    def _run(self) -> None:
        while not self.stop.wait(0.5):  # a renewal loop, not a wait for something
            with self.lock:
                if self.holder is None:
                    continue
                try:
                    hold(self.c, self.holder)
                except ApiError as exc:  # the Lease deleted (HA off): the agent retries, so does this
                    if exc.code != 404:
                        raise


@pytest.fixture
def renewer(cluster: Cluster) -> Iterator[Renewer]:
    r = Renewer(cluster)
    yield r
    r.stop.set()
    r.thread.join(5)


def ha_status(c: Cluster) -> dict[str, Any]:
    return dict((gw(c).get("status") or {}).get("ha") or {})


def start_ha(c: Cluster, *args: str) -> Controller:
    return start(c, "--allow-ha", *args, config=ha_config(c))


def test_an_ha_gateway_gets_two_slots_on_two_nodes_a_lease_and_ha_in_both_plans(cluster: Cluster) -> None:
    start_ha(cluster)
    apply_ha(cluster)
    wait_for(lambda: home(cluster, "Deployment", "b"), 20, "slot b's Deployment")
    a, b = home(cluster, "Deployment"), home(cluster, "Deployment", "b")
    assert node_of(a) and node_of(b) and node_of(a) != node_of(b), (node_of(a), node_of(b))
    assert b is not None and b["spec"]["template"]["metadata"]["labels"][LABEL_HA_SLOT] == "b"
    lease = home(cluster, "Lease", api=COORD)
    assert lease is not None and not lease["spec"].get("holderIdentity"), lease
    plans = [plan_of(cm) for cm in (home(cluster, "ConfigMap", s, "v1") for s in "ab") if cm is not None]
    assert len(plans) == 2
    assert {p.ha.lease if p.ha else None for p in plans} == {lease["metadata"]["name"]}
    assert [p.nic.mac for p in plans] == [NIC["mac"], NIC_B["mac"]]
    wait_for(lambda: condition(gw(cluster), "StandbyReady").get("reason") == "NoHolder", 20, "NoHolder")


def test_status_follows_the_lease_and_a_failover_waits_for_the_expiry(
    cluster: Cluster, renewer: Renewer
) -> None:
    ctl = start_ha(cluster)
    apply_ha(cluster)
    wait_for(lambda: home(cluster, "Deployment", "b"), 20, "slot b's Deployment")
    pod_a, pod_b = run_pod(cluster, "a"), run_pod(cluster, "b")
    renewer.set(pod_a)
    wait_for(lambda: ha_status(cluster).get("activePod") == pod_a, 20, "slot a active")
    st = ha_status(cluster)
    assert st["activeSlot"] == "a" and st["standbyPod"] == pod_b and "lastFailoverTime" not in st, st
    wait_for(lambda: condition(gw(cluster), "StandbyReady").get("status") == "True", 20, "StandbyReady")
    assert condition(gw(cluster), "Ready")["status"] == "True"

    # pod_a stops renewing (killed), and pod_b claims the Lease at once (an agent would wait for the
    # expiry by its own clock; this one does not): the controller, which saw pod_a's last renewal just
    # now, moves nothing before that renewal plus the duration (3 s), whenever the holder changes.
    renewer.set(None)
    last_renewal = time.monotonic()
    renewer.set(pod_b)
    wait_for(lambda: ha_status(cluster).get("activeSlot") == "b", 30, "the failover to slot b")
    assert time.monotonic() - last_renewal >= 3.0, "moved before the previous holder's Lease expired"
    st = ha_status(cluster)
    assert st["activePod"] == pod_b and st["lastFailoverReason"] == "LeaseExpired", st
    # Counted once the reconcile's writes went through: a moment after the status the test just read.
    wait_for(lambda: metric(ctl, "vpngw_controller_ha_failovers_total") == 1, 10, "the failover counted")
    reasons = [e.get("reason") for e in cluster.kube.list("v1", "Event", NS)]
    assert "Failover" in reasons, reasons

    # pod_b is deleted: its agent empties the holder as it stops, and a new slot a pod takes over at once
    # (a release by a pod that is not going counts as an expiry: tests/unit/test_controller_ha.py).
    renewer.set(None)
    cluster.kube.delete("v1", "Pod", pod_b, GATEWAY_NAMESPACE)
    hold(cluster, "")
    pod_a2 = run_pod(cluster, "a", "2")
    renewer.set(pod_a2)
    wait_for(lambda: ha_status(cluster).get("activePod") == pod_a2, 20, "the handover back to slot a")
    assert ha_status(cluster)["lastFailoverReason"] == "Released"


def test_turning_ha_off_keeps_the_serving_slot_then_drops_slot_b_then_the_lease(
    cluster: Cluster, renewer: Renewer
) -> None:
    start_ha(cluster)
    apply_ha(cluster)
    wait_for(lambda: home(cluster, "Deployment", "b"), 20, "slot b's Deployment")
    pod_a, pod_b = run_pod(cluster, "a"), run_pod(cluster, "b")
    renewer.set(pod_a)
    wait_for(lambda: ha_status(cluster).get("activePod") == pod_a, 20, "slot a active")

    cluster.kube.patch(VPN, "VPNGateway", "acme", {"spec": {"ha": {"enabled": False}}}, NS)
    wait_for(lambda: home(cluster, "Deployment", "b") is None, 20, "slot b's Deployment deleted")
    wait_for(lambda: home(cluster, "ConfigMap", "b", "v1") is None, 20, "slot b's ConfigMap deleted")
    # Slot b's pod is still going: the Lease and slot a's plan section stay, so it can never take over.
    assert home(cluster, "Lease", api=COORD) is not None
    cm = home(cluster, "ConfigMap", "a", "v1")
    assert cm is not None and plan_of(cm).ha is not None
    cluster.kube.delete("v1", "Pod", pod_b, GATEWAY_NAMESPACE)

    def plan_without_ha() -> bool:
        cm = home(cluster, "ConfigMap", "a", "v1")
        return cm is not None and plan_of(cm).ha is None

    wait_for(plan_without_ha, 20, "slot a's plan without ha once slot b's pods are gone")
    wait_for(lambda: "ha" not in (gw(cluster).get("status") or {}), 20, "status.ha removed")
    # Slot a's agent renews until its plan loses ha: the Lease stays meanwhile (a holder reading a 404
    # before its new plan would stand down); its agent then releases it, and the Lease goes.
    assert home(cluster, "Lease", api=COORD) is not None
    renewer.set(None)
    hold(cluster, "")
    wait_for(lambda: home(cluster, "Lease", api=COORD) is None, 20, "the Lease deleted once released")
    assert home(cluster, "Deployment") is not None, "slot a, serving, stays"
    assert "StandbyReady" not in {c["type"] for c in gw(cluster)["status"]["conditions"]}


def test_ha_where_the_operator_does_not_allow_it_runs_one_pod_and_says_why(cluster: Cluster) -> None:
    start(cluster, config=ha_config(cluster))
    apply_ha(cluster)
    wait_for(lambda: condition(gw(cluster), "StandbyReady").get("reason") == "HANotAllowed", 20, "refused")
    wait_for(lambda: home(cluster, "Deployment"), 20, "slot a's Deployment")
    assert home(cluster, "Deployment", "b") is None
    assert home(cluster, "Lease", api=COORD) is None
    cm = home(cluster, "ConfigMap", "a", "v1")
    assert cm is not None and plan_of(cm).ha is None
    assert "--allow-ha" in condition(gw(cluster), "StandbyReady")["message"]
