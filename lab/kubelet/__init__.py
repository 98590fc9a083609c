"""The lab kubelet: runs the pods the controller's Deployments describe, for the Kubernetes API EMULATOR
(lab.kubeapi), in network namespaces of the lab (docs/e2e.md). An emulator of a kubelet, not one."""

from lab.kubelet.kubelet import LabKubelet, LabKubeletThread, cleanup_stale
from lab.kubelet.settings import KubeletSettings

__all__ = ["KubeletSettings", "LabKubelet", "LabKubeletThread", "cleanup_stale"]
