"""A REAL Kubernetes control plane for the lab: etcd, kube-apiserver and kube-controller-manager built
from the Go module proxy by scripts/setup_controlplane.sh (lab/controlplane/go.mod pins the releases),
run as child processes with TLS, RBAC + Node authorisation, production admission plugins and the
controllers the operator depends on (docs/controlplane.md).

``ControlPlane`` runs one (``with ControlPlane() as cp: cp.kubectl("get", "ns")``);
``python -m lab controlplane up|down`` from a shell; ``lab.controlplane.fixtures`` for pytest."""

from lab.controlplane.cluster import ControlPlane, ControlPlaneError, cleanup_stale, missing_binaries
from lab.controlplane.flags import NodeTimings

__all__ = ["ControlPlane", "ControlPlaneError", "NodeTimings", "cleanup_stale", "missing_binaries"]
