"""What a kubelet does for its Node object, and nothing more (``NodeAgent``): for tests against the real
control plane, where the node lifecycle controller marks a node that stops heart-beating Unknown and taints
it (lab.controlplane.flags.NodeTimings)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from lab.controlplane.cluster import ControlPlane


class NodeAgent:
    """What a kubelet does for its Node object, nothing more: registers it (with the node's own
    client certificate), posts Ready and renews its Lease every ``interval`` until ``silence()``."""

    def __init__(self, cp: ControlPlane, name: str, interval: float = 1.0) -> None:
        self.cp, self.name, self.interval = cp, name, interval
        self.kubeconfig = cp.node_kubeconfig(name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"node-{name}", daemon=True)
        self.errors: list[str] = []
        self.ready = True
        self._beat = (
            threading.Lock()
        )  # one heartbeat at a time: set_ready's is never overtaken by an older one
        """What the heartbeat posts: Ready, or (``set_ready(False)``) NotReady as a kubelet whose
        container runtime is down reports it (its Lease is still renewed)."""

    def register(
        self,
        *,
        ready: bool = True,
        labels: Mapping[str, str] | None = None,
        provider_id: str | None = None,
    ) -> None:
        """Create the Node (with ``labels`` besides the hostname one, and ``provider_id``: what a kubelet
        with a cloud provider registers) and its Lease; with ``ready``, post Ready and start heart-beating
        (else ``start()`` does, as a kubelet that registers before its first status)."""
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            # The labels a kubelet registers with (pkg/kubelet/kubelet_node_status.go initialNode); the
            # chart's default nodeSelectors (kubernetes.io/os: linux) place on them.
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
        }
        if provider_id:
            node["spec"] = {"providerID": provider_id}
        created = self.cp.kubectl(
            "create", "-f", "-", "-o", "json", kubeconfig=self.kubeconfig, input=json.dumps(node)
        )
        uid = str(json.loads(created.stdout)["metadata"]["uid"])
        # Owned by the Node, as a kubelet's lease controller sets it (pkg/kubelet/util/nodelease.go
        # SetNodeOwnerFunc): the garbage collector deletes the Lease once the Node is gone.
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": uid}],
            },
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": _now()},
        }
        # The Lease of an earlier node of this name may not be collected yet (it names the old Node's
        # uid): deleted first, where a kubelet would renew it until the collector deletes it and then
        # create its own.
        self.cp.kubectl(
            "delete", "lease", self.name, "-n", "kube-node-lease", "--ignore-not-found", "--wait=false",
            kubeconfig=self.kubeconfig,
        )  # fmt: skip
        self.cp.kubectl("create", "-f", "-", kubeconfig=self.kubeconfig, input=json.dumps(lease))
        if ready:
            self.start()

    def start(self) -> None:
        with self.cp.client(self.kubeconfig) as c:
            self._heartbeat(c)
        self._thread.start()

    def set_ready(self, ready: bool) -> None:
        """Post Ready (True) or NotReady (False, reason KubeletNotReady) now and at every heartbeat."""
        with self._beat:
            self.ready = ready
        with self.cp.client(self.kubeconfig) as c:
            self._heartbeat(c)

    def _heartbeat(self, c: httpx.Client) -> None:
        with self._beat:
            self._post(c)

    def _post(self, c: httpx.Client) -> None:
        now = _now()
        ready = {
            "type": "Ready",
            "status": "True" if self.ready else "False",
            "reason": "KubeletReady" if self.ready else "KubeletNotReady",
            "message": "lab node agent" if self.ready else "lab node agent: container runtime is down",
            "lastHeartbeatTime": now,
            "lastTransitionTime": self._ready_since(c) or now,
        }
        r = c.patch(
            f"/api/v1/nodes/{self.name}/status",
            json={"status": {"conditions": [ready]}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        if r.status_code != 200:
            self.errors.append(f"status {r.status_code} {r.text[:200]}")
        r = c.patch(
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}",
            json={"spec": {"renewTime": now}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if r.status_code != 200:
            self.errors.append(f"lease {r.status_code} {r.text[:200]}")

    def _ready_since(self, c: httpx.Client) -> str | None:
        """When the Node's Ready condition became what ``ready`` says, while it still is: a kubelet keeps
        lastTransitionTime until the status changes (pkg/kubelet/nodestatus ReadyCondition compares with
        the Node it read; the node lifecycle controller's Unknown is such a change)."""
        r = c.get(f"/api/v1/nodes/{self.name}")
        if r.status_code != 200:
            return None
        conds = (r.json().get("status") or {}).get("conditions") or []
        cur = next((x for x in conds if x.get("type") == "Ready"), None)
        if cur is None or cur.get("status") != ("True" if self.ready else "False"):
            return None
        return str(cur.get("lastTransitionTime") or "") or None

    def _run(self) -> None:
        with self.cp.client(self.kubeconfig) as c:
            while not self._stop.wait(self.interval):
                self._heartbeat(c)

    def silence(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
