"""The lab's node agent (lab/controlplane/nodeagent.py) on the real control plane, as a kubelet: the Ready
condition's lastTransitionTime is kept while Ready holds (only lastHeartbeatTime moves), and the node
Lease is owned by the Node (pkg/kubelet/util/nodelease.go SetNodeOwnerFunc), so a node registered again
under the same name gets a Lease of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lab.controlplane import ControlPlane
from lab.controlplane.nodeagent import NodeAgent
from lab.wait import wait_for

pytestmark = pytest.mark.lab


def ready(cp: ControlPlane, name: str) -> dict[str, Any]:
    with cp.client() as c:
        node = c.get(f"/api/v1/nodes/{name}").json()
    conds = (node.get("status") or {}).get("conditions") or []
    return next((x for x in conds if x.get("type") == "Ready"), {})


def lease(cp: ControlPlane, name: str) -> dict[str, Any]:
    res = cp.kubectl("get", "lease", name, "-n", "kube-node-lease", "-o", "json")
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_ready_keeps_its_transition_time_and_the_lease_is_the_nodes(controlplane: ControlPlane) -> None:
    cp, name = controlplane, "na-keep"
    agent = NodeAgent(cp, name, interval=0.5)
    try:
        agent.register()
        first = wait_for(lambda: ready(cp, name).get("status") == "True" and ready(cp, name), 10, "Ready")
        later = wait_for(
            lambda: (r := ready(cp, name)).get("lastHeartbeatTime") != first["lastHeartbeatTime"] and r,
            10,
            "a later heartbeat (whole seconds)",
        )
        assert later["lastTransitionTime"] == first["lastTransitionTime"], (first, later)
        uid = cp.kubectl("get", "node", name, "-o", "jsonpath={.metadata.uid}").stdout
        owners = lease(cp, name)["metadata"].get("ownerReferences")
        assert owners == [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}], owners
        assert agent.errors == [], agent.errors
    finally:
        agent.silence()

    # The Node deleted (a cloud controller manager's part) and registered again at once: the new Node's
    # Lease, whatever the garbage collector has done with the old one yet.
    cp.kubectl("delete", "node", name)
    again = NodeAgent(cp, name, interval=0.5)
    try:
        again.register()
        uid = cp.kubectl("get", "node", name, "-o", "jsonpath={.metadata.uid}").stdout
        assert lease(cp, name)["metadata"]["ownerReferences"][0]["uid"] == uid
        wait_for(lambda: ready(cp, name).get("status") == "True", 10, "Ready again")
        assert again.errors == [], again.errors
    finally:
        again.silence()
        cp.kubectl("delete", "node", name, "--ignore-not-found")
