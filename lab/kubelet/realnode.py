"""The lab kubelet as a node of the REAL control plane (lab.controlplane: kube-apiserver and
kube-controller-manager v1.35), not of the API emulator (docs/controlplane.md, "The lab kubelet as a node").

``RealNode`` is one node:

* its Node object and node Lease, heart-beaten with the node's own client certificate
  (``system:node:<name>`` in ``system:nodes``, so the Node authorizer and NodeRestriction judge it) by
  ``NodeAgent``;
* a ``LabKubelet`` running the pods bound to it (``spec.nodeName``) with ``deployments=False`` (the real
  ReplicaSet controller makes the pods) and ``deletion="api"`` (a terminating pod is deleted with
  gracePeriodSeconds 0 once its containers stopped, as the real API server expects of a kubelet); its
  pods reach the API server through the kubelet's relay at the in-cluster address (10.96.0.1:443, a SAN
  of the real serving certificate), with tokens from the real TokenRequest API and the control plane's
  CA in their projected ``ca.crt`` (the real root-ca publisher's ``kube-root-ca.crt``).

The kubelet's own API calls (its informers list and watch every ConfigMap and Secret, it writes pod
status, annotations and deletions, asks for tokens) use the ADMIN kubeconfig: a real kubelet reads only
what its pods reference, one object at a time, which the Node authorizer allows and the lab kubelet's
cluster-wide caches would not get. The node's identity is real where the node lifecycle controller
looks: the Node and its Lease.

``silence()`` is a partition, not a stop: the heartbeat ends, the kubelet writes nothing more and sees
nothing more, its pods lose the API server (the relay is cut), and every process keeps running.
"""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType
from urllib.parse import urlsplit

from lab.controlplane.cluster import ControlPlane
from lab.controlplane.nodeagent import NodeAgent
from lab.kubelet.kubelet import LabKubeletThread
from lab.kubelet.settings import KubeletSettings


class RealNode:
    """``with RealNode(cp, settings) as node:`` the node registered and Ready, its kubelet running; leaving
    stops its pods (without confirming anything to the API server) and the heartbeat. The Node object is
    left to the caller (deleting it is what a cloud controller manager does when the server is gone)."""

    def __init__(self, cp: ControlPlane, settings: KubeletSettings, *, heartbeat: float = 0.5) -> None:
        self.cp = cp
        self.settings = replace(settings, deployments=False, deletion="api")
        self.agent = NodeAgent(cp, self.settings.node, interval=heartbeat)
        port = urlsplit(cp.url).port
        assert port is not None
        self.kubelet = LabKubeletThread(self.settings, cp.kubeconfig, ("127.0.0.1", port), cp.ca_file)
        self.silenced = False
        self._entered = False

    @property
    def name(self) -> str:
        return self.settings.node

    def __enter__(self) -> RealNode:
        self.agent.register()
        try:
            self.kubelet.__enter__()
            self._entered = True
        except BaseException:
            self.agent.silence()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._entered:
                self.kubelet.__exit__(et, ev, tb)
        finally:
            self.agent.silence()

    def silence(self) -> None:
        """The node is partitioned: no heartbeat, no API call from its kubelet or through its relay; its
        pods' processes keep running (the node lifecycle controller does the rest)."""
        self.silenced = True
        self.agent.silence()
        self.kubelet.partition()
