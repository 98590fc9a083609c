"""A node that dies, on the REAL control plane (kube-apiserver, kube-controller-manager v1.35: the node
lifecycle, deployment, ReplicaSet and pod GC controllers), with the chart's static cloud (issue 21,
item 1):

* the node stops heart-beating (its ``NodeAgent`` goes silent: a partitioned node, nothing confirms
  anything); the controller re-pins the gateway to the other VPN node; the Deployment's Recreate strategy
  deletes the old pod, which stays Terminating (no kubelet confirms it), and the new pod is not made: the
  real server's behaviour the emulator never showed;
* without a cloud fence the controller leaves that pod alone while the node merely is NotReady (it may be
  cut off from the API only, its pod still serving): the gateway waits;
* the node is deleted (as a cloud controller manager does when the server is gone): the controller
  deletes the pod with grace 0 at once, says so in an Event, and the ReplicaSet controller makes the new
  pod on the other node. (The pod GC controller would also delete it, after its 40 s quarantine.)

And with the OpenStack cloud (a REAL Neutron, lab/openstack, and the Nova emulator): the node only goes
NotReady, nothing ever deletes its pod on a real cluster; once the gateway's port is attached to the other
node's server (the fence: the old pod has no NIC2 any more), the controller deletes the old pod with
grace 0 and the new one starts.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cloudplan import tags
from controller.names import GatewayKey
from lab.cluster import Controller, clouds_yaml, openstack_args, secrets_for
from lab.controlplane import ControlPlane
from lab.controlplane.nodeagent import NodeAgent
from lab.openstack.fixtures import OpenStackLab
from lab.wait import wait_for
from tests.component.test_helm_install import GATEWAYS, spawn_controller
from tests.integration.test_real_install import (
    EXAMPLE,
    NODE,
    TENANT,
    get,
    helm,
    installed,
    node,
    owned,
    start_controller,
    waiting,
)

__all__ = ["helm", "installed", "node"]  # the fixtures

pytestmark = pytest.mark.lab

OTHER = "vpn-b"


def pods(cp: ControlPlane) -> list[dict[str, Any]]:
    return owned(cp, "pods", GATEWAYS)


@pytest.fixture
def other(controlplane: ControlPlane) -> Iterator[NodeAgent]:
    """The second VPN node, heart-beating."""
    agent = NodeAgent(controlplane, OTHER, interval=0.5)
    agent.register()
    controlplane.kubectl("label", "node", OTHER, "node-role.kubernetes.io/vpn=")
    yield agent
    agent.silence()
    controlplane.kubectl("delete", "node", OTHER, "--wait=false", check=False)


def apply_example(cp: ControlPlane) -> None:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets_for(docs)))
    cp.kubectl("apply", "-f", str(EXAMPLE))


def gateway_node(cp: ControlPlane) -> Any:
    return (get(cp, "vpngateway", "acme", "-n", TENANT) or {}).get("status", {}).get("nodeName")


def delete_gateway(cp: ControlPlane, ctl: Controller) -> None:
    cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--wait=false", check=False)
    waiting(ctl, cp, lambda: get(cp, "vpngateway", "acme", "-n", TENANT) is None, 60, "the CR deleted")
    code = ctl.stop(signal.SIGTERM)
    assert code == 0, f"the controller exited {code} on SIGTERM:\n{ctl.log()[-4000:]}"


def force_deleted(cp: ControlPlane) -> list[dict[str, Any]]:
    out = cp.kubectl(
        "get", "events", "-n", TENANT, "--field-selector", "reason=PodForceDeleted", "-o", "json"
    )
    return list(json.loads(out.stdout)["items"])


def test_a_dead_nodes_gateway_comes_back_on_another_node_once_the_node_is_gone(
    controlplane: ControlPlane, installed: Path, node: NodeAgent, other: NodeAgent, tmp_path: Path
) -> None:
    cp = controlplane
    ctl = start_controller(cp, installed, tmp_path)
    try:
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 60, "the controller to be ready")
        apply_example(cp)
        first = waiting(ctl, cp, lambda: (p := pods(cp)) and p[0], 60, "the gateway pod")
        assert first["spec"]["nodeName"] == NODE

        node.silence()  # partitioned: the node lifecycle controller marks it Unknown and taints it
        waiting(ctl, cp, lambda: gateway_node(cp) == OTHER, 60, f"the gateway re-pinned to {OTHER}")

        def old_terminating() -> bool:
            p = get(cp, "pod", first["metadata"]["name"], "-n", GATEWAYS)
            return bool(p and p["metadata"].get("deletionTimestamp"))

        waiting(ctl, cp, old_terminating, 60, "the Recreate rollout deleting the old pod")
        # What a real cluster does with it: nothing (no kubelet confirms), and Recreate waits for it. The
        # controller, without a fence, must wait too: the node may only be cut off from the API.
        time.sleep(3)
        assert [p["metadata"]["name"] for p in pods(cp)] == [first["metadata"]["name"]]
        assert "pod.force_deleted" not in ctl.log()

        cp.kubectl("delete", "node", NODE, "--wait=false")
        new = waiting(
            ctl,
            cp,
            lambda: (p := [x for x in pods(cp) if x["spec"].get("nodeName") == OTHER]) and p[0],
            60,
            f"the new gateway pod on {OTHER}",
        )
        assert get(cp, "pod", first["metadata"]["name"], "-n", GATEWAYS) is None
        assert new["metadata"]["uid"] != first["metadata"]["uid"]
        events = force_deleted(cp)
        assert [e["involvedObject"]["name"] for e in events] == ["acme"], events
        assert f"node {NODE} is gone or out of service" in events[0]["message"]
        assert ctl.proc.poll() is None, ctl.log()
    finally:
        delete_gateway(cp, ctl)


def test_with_openstack_the_fence_lets_a_not_ready_nodes_gateway_move(
    controlplane: ControlPlane,
    installed: Path,
    node: NodeAgent,
    other: NodeAgent,
    openstack_lab: OpenStackLab,
    tmp_path: Path,
) -> None:
    cp, lab = controlplane, openstack_lab
    servers = {NODE: lab.cloud.nodes[0], OTHER: lab.cloud.nodes[1]}
    for name, n in servers.items():
        cp.kubectl(
            "patch", "node", name, "--type=merge", "-p", json.dumps({"spec": {"providerID": n.provider_id}})
        )
    # The chart's controller, its cloud switched to OpenStack (the lab's Neutron and Nova).
    deployment = get(cp, "deployment", "vpngw-controller", "-n", "vpngw-system")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    net = lab.cloud
    container["args"] = [a for a in container["args"] if a != "--cloud=static"] + openstack_args(
        net.gateway.network_id, net.gateway.subnet_id, net.external.network_id
    )
    # Not under /tmp: the pod's emptyDir at /tmp (HOME) would take the path over (pod_process).
    cfg = clouds_yaml(
        Path(tempfile.mkdtemp(dir="/var/tmp")) / "clouds.yaml", lab.network_url, lab.compute_url
    )
    container["env"] = [*container.get("env", []), {"name": "OS_CLIENT_CONFIG_FILE", "value": str(cfg)}]
    ctl = spawn_controller(
        deployment, lambda kind, name: get(cp, kind.lower(), name, "-n", "vpngw-system"), installed, tmp_path
    )
    conn = lab.connect(direct=True)
    key_tags = ",".join(tags(GatewayKey("VPNGateway", TENANT, "acme"), "vpngw"))

    def port() -> Any:
        found = list(conn.network.ports(tags=key_tags))
        return found[0] if found else None

    try:
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 60, "the controller to be ready")
        apply_example(cp)
        first = waiting(ctl, cp, lambda: (p := pods(cp)) and p[0], 60, "the gateway pod")
        assert first["spec"]["nodeName"] == NODE
        waiting(
            ctl, cp, lambda: (p := port()) and p.device_id == servers[NODE].server_id, 60, "the port on vpn-a"
        )

        node.silence()  # partitioned, and it stays a Node: nothing in Kubernetes ever deletes its pod
        new = waiting(
            ctl,
            cp,
            lambda: (p := [x for x in pods(cp) if x["spec"].get("nodeName") == OTHER]) and p[0],
            90,
            f"the new gateway pod on {OTHER}",
        )
        assert port().device_id == servers[OTHER].server_id, "the fence: NIC2 on the new node's server"
        assert get(cp, "pod", first["metadata"]["name"], "-n", GATEWAYS) is None
        assert get(cp, "node", NODE) is not None, "the node was never deleted"
        assert new["metadata"]["uid"] != first["metadata"]["uid"]
        events = force_deleted(cp)
        assert [e["involvedObject"]["name"] for e in events] == ["acme"], events
        assert f"NIC2 is attached to {OTHER} now" in events[0]["message"]
    finally:
        delete_gateway(cp, ctl)
        shutil.rmtree(cfg.parent)
    assert port() is None, "released"
