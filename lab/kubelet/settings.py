"""The lab kubelet's settings (one node), and what a pod's worker needs from its kubelet (``PodHost``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from gwkit.kube import KubeClient
from lab.kubelet.cache import Cache
from lab.kubelet.runtime import ContainerRun, PodmanRuntime, ProcessRuntime
from lab.kubelet.sandbox import NodeNetwork


@dataclass(frozen=True)
class KubeletSettings:
    node: str
    """The Node's name (``spec.nodeName`` of the pods this kubelet runs)."""
    node_ns: str
    """The network namespace that plays the node: it holds the interfaces host-device moves into pods."""
    runtime: Literal["process", "podman"] = "process"
    pod_cidr: str = "10.244.1.0/24"
    node_ip: str | None = None
    api_address: str = "10.96.0.1"
    """The API server's in-cluster address (``kubernetes.default.svc``): the emulator's certificate must
    carry it (``KubeAPI(sans=...)``)."""
    api_port: int = 443
    dns_address: str = "10.96.0.10"
    cluster_domain: str = "cluster.local"
    dns_records: Mapping[str, str] = field(default_factory=dict)
    volume_refresh_delay: float = 60.0
    """Seconds between a ConfigMap/Secret change the kubelet saw and its volume being updated."""
    allowed_unsafe_sysctls: tuple[str, ...] = ("net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter")
    backoff_initial: float = 10.0
    backoff_max: float = 300.0
    backoff_reset: float = 600.0
    probe_period_factor: float = 1.0
    """Scales every probe's periodSeconds (1: as written)."""
    deployments: bool = True
    """Also play the Deployment controller (one per cluster: only one node's kubelet should). False on
    the real control plane (lab.controlplane), whose ReplicaSet controller makes the pods."""
    deletion: Literal["finalizer", "api"] = "finalizer"
    """How the deletion of a pod is confirmed once its containers stopped: ``finalizer`` releases the
    emulator's graceful-termination finalizer (model.GRACEFUL_FINALIZER, how lab.kubeapi models graceful
    deletion); ``api`` deletes it with gracePeriodSeconds 0 and its uid as precondition, as a kubelet
    does on a real kube-apiserver (which keeps a pod deleted with a grace period until then)."""
    lab_charon: bool = True
    """Run charon containers as the lab's kernel needs (adapt.py)."""
    workdir: Path | None = None
    keep_logs: bool = False
    """Keep each pod's directory (container logs) after it stopped: for failing tests' output."""


class PodHost(Protocol):
    """The node a ``PodWorker`` runs on (``LabKubelet``)."""

    settings: KubeletSettings
    root: Path
    run_id: str
    node_network: NodeNetwork
    runtime: ProcessRuntime | PodmanRuntime
    runtime_default_user: int
    configmaps: Cache
    secrets: Cache
    partitioned: bool
    """Cut off from the API server: nothing is written (the pods keep running as they are)."""

    @property
    def kube(self) -> KubeClient: ...

    async def nad(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def ensure_root_ca(self, namespace: str) -> None: ...

    async def ensure_default_service_account(self, namespace: str) -> None: ...

    def adapt_charon(self, run: ContainerRun) -> None: ...

    async def remove_pod_containers(self, prefix: str) -> None: ...
