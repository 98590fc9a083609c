"""The control plane's decisions, pure: every flag of etcd, kube-apiserver and kube-controller-manager
and why, the kubeconfig documents, and the few rules read off a process's log (no I/O here).

The flags are those of the pinned release (k8s.io/kubernetes v1.35.4, etcd v3.6.5: lab/controlplane/go.mod);
docs/controlplane.md explains them as a whole.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_CIDR = "10.96.0.0/16"
"""The Service range (the project's charts and the emulator use 10.96.0.1 for the API's Service IP)."""
SERVICE_IP = "10.96.0.1"
"""The first address of ``SERVICE_CIDR``: the ``kubernetes`` Service, a SAN of the serving cert."""
ISSUER = "https://kubernetes.default.svc.cluster.local"
"""The ServiceAccount token issuer (and audience): what kubeadm and most distributions use."""

ADMISSION_PLUGINS = (
    # The release's default set (pkg/kubeapiserver/options/plugins.go, DefaultOffAdmissionPlugins),
    # written out so that what runs is read here rather than remembered; --enable-admission-plugins
    # adds to the defaults, so listing them changes nothing but the reading.
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "TaintNodesByCondition",
    "PodSecurity",  # the Pod Security Standards per namespace label (pod-security.kubernetes.io/*)
    "Priority",
    "DefaultTolerationSeconds",  # not-ready/unreachable NoExecute tolerations of 300 s on every pod
    "DefaultStorageClass",
    "StorageObjectInUseProtection",
    "PersistentVolumeClaimResize",
    "RuntimeClass",
    "CertificateApproval",
    "CertificateSigning",
    "ClusterTrustBundleAttest",
    "CertificateSubjectRestriction",
    "DefaultIngressClass",
    "PodTopologyLabels",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
    # On in production clusters, off by default:
    "NodeRestriction",  # a node may only change its own Node, Lease and its pods' status (with Node authz)
    # OpenShift has it on: setting metadata.ownerReferences[].blockOwnerDeletion needs `update` on the
    # owner's `finalizers` subresource (the controller's Deployments/ConfigMaps own nothing it may not).
    "OwnerReferencesPermissionEnforcement",
)

CONTROLLERS = (
    # Canonical names of v1.35 (cmd/kube-controller-manager/names); nothing else runs.
    "serviceaccount-token-controller",  # legacy token Secrets; started first (needs the SA private key)
    "serviceaccount-controller",  # the `default` ServiceAccount in every namespace (our readiness probe)
    "root-ca-certificate-publisher-controller",  # the kube-root-ca.crt ConfigMap projected tokens mount
    "namespace-controller",  # deletes a terminating namespace's contents, then the namespace
    "garbage-collector-controller",  # ownerReferences: cascading and orphaning deletes
    "deployment-controller",
    "replicaset-controller",
    "node-lifecycle-controller",  # Ready=Unknown on a silent node, the unreachable/not-ready taints
    "taint-eviction-controller",  # deletes pods that do not tolerate a NoExecute taint (taint-based eviction)
    "pod-garbage-collector-controller",  # orphaned pods (node gone), terminated pods over the threshold
    "clusterrole-aggregation-controller",  # fills admin/edit/view from the aggregated ClusterRoles
    "disruption-controller",  # PodDisruptionBudget status (the chart ships a PDB; eviction reads it)
)


@dataclass(frozen=True)
class Ports:
    """Loopback TCP ports, picked free before start (a child cannot be given port 0: the caller retries
    with new ports when a process reports EADDRINUSE)."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int


@dataclass(frozen=True)
class NodeTimings:
    """How fast the node lifecycle controller acts, in seconds: short for the lab (a silent node is
    Ready=Unknown and tainted within ``monitor_grace`` + ``monitor_period``), production's in comments."""

    monitor_period: float = 1.0  # --node-monitor-period (production 5 s): how often node health is checked
    monitor_grace: float = 4.0  # --node-monitor-grace-period (production 50 s): silence before Unknown
    startup_grace: float = 10.0  # --node-startup-grace-period (production 60 s): for a new node
    eviction_rate: float = 2.0
    """--node-eviction-rate, nodes/s tainted NoExecute (production 0.1). Not 1: when the first node
    registers before it posts Ready, the controller enters "master disruption mode" (every zone's
    NoExecute limiter set to never), and leaving it restores the rate with
    ``RateLimitedTimedQueue.SwapLimiter``, which returns early when the current limiter's QPS equals the
    new one, and the never-limiter reports a QPS of 1: at a rate of exactly 1 no node is ever tainted
    NoExecute again (observed with v1.35.4; production's 0.1 and our 2 are unaffected)."""


@dataclass(frozen=True)
class Layout:
    """Where everything of one control plane lives: ``run_dir`` (certificates, kubeconfigs, logs) and
    ``data_dir`` (etcd's, on a tmpfs when there is one)."""

    run_dir: Path
    data_dir: Path

    @property
    def pki(self) -> Path:
        return self.run_dir / "pki"

    @property
    def ca_crt(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.pki / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.pki / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.pki / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.pki / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.pki / "sa.pub"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.run_dir / "admin.kubeconfig"

    @property
    def controller_manager_kubeconfig(self) -> Path:
        return self.run_dir / "controller-manager.kubeconfig"

    def log(self, component: str) -> Path:
        return self.run_dir / f"{component}.log"


def _seconds(value: float) -> str:
    """A Go duration for ``value`` seconds (milliseconds precision)."""
    return f"{round(value * 1000)}ms"


def etcd_argv(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    """A single-member etcd on loopback, plain HTTP (nothing but the apiserver on this machine talks to
    it; kube-apiserver's etcd client supports TLS, the lab does not need it)."""
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=lab",
        f"--data-dir={layout.data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        # A single member still listens for peers; the default (localhost:2380) would collide with
        # any other etcd on the machine.
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=lab={peer}",
        "--initial-cluster-state=new",
        "--log-level=warn",
    ]


def apiserver_argv(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        "--advertise-address=127.0.0.1",
        # The `kubernetes` Service gets no Endpoints: a loopback address is not a valid endpoint, and no
        # pod network exists to reach another (the lab kubelet relays to the API itself).
        "--endpoint-reconciler-type=none",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--tls-cert-file={layout.apiserver_crt}",
        f"--tls-private-key-file={layout.apiserver_key}",
        # Client certificates signed by the cluster CA authenticate (admin: O=system:masters; nodes:
        # system:node:NAME in system:nodes; the controller manager: system:kube-controller-manager).
        f"--client-ca-file={layout.ca_crt}",
        "--authorization-mode=Node,RBAC",
        f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
        # Privileged containers are possible at all (as on kubeadm clusters); PodSecurity decides per
        # namespace. Without it the apiserver refuses them before PodSecurity is asked.
        "--allow-privileged=true",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={layout.sa_pub}",  # verifies tokens
        f"--service-account-signing-key-file={layout.sa_key}",  # TokenRequest signs with it
        f"--api-audiences={ISSUER}",
        # No front-proxy CA: no aggregated API server runs here (the aggregator works without one).
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(binary: Path, layout: Layout, ports: Ports, nodes: NodeTimings) -> list[str]:
    kubeconfig = str(layout.controller_manager_kubeconfig)
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # Its secure port authenticates and authorises by asking the apiserver (TokenReview,
        # SubjectAccessReview); /healthz, /readyz, /livez are always allowed (the default of
        # --authorization-always-allow-paths), so the readiness probe needs no credentials.
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        f"--controllers={','.join(CONTROLLERS)}",
        # Each controller acts as its own ServiceAccount in kube-system (its RBAC role), as in
        # production, not as the all-powerful system:kube-controller-manager.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={layout.sa_key}",  # the token controller signs with it
        f"--root-ca-file={layout.ca_crt}",  # what kube-root-ca.crt and token Secrets carry
        f"--node-monitor-period={_seconds(nodes.monitor_period)}",
        f"--node-monitor-grace-period={_seconds(nodes.monitor_grace)}",
        f"--node-startup-grace-period={_seconds(nodes.startup_grace)}",
        f"--node-eviction-rate={nodes.eviction_rate:g}",
        "--profiling=false",
        "--v=1",
    ]


def kubeconfig_doc(
    server: str,
    ca_pem: bytes,
    user: str,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A kubeconfig for one identity: a client certificate (``cert_pem``/``key_pem``) or a bearer token."""
    if (token is None) == (cert_pem is None or key_pem is None):
        raise ValueError("a kubeconfig needs either a client certificate and key, or a token")
    creds: dict[str, str]
    if token is not None:
        creds = {"token": token}
    else:
        assert cert_pem is not None and key_pem is not None
        creds = {
            "client-certificate-data": base64.b64encode(cert_pem).decode(),
            "client-key-data": base64.b64encode(key_pem).decode(),
        }
    cluster = {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab-controlplane", "cluster": cluster}],
        "users": [{"name": user, "user": creds}],
        "contexts": [
            {"name": user, "context": {"cluster": "lab-controlplane", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
        "preferences": {},
    }


_IN_USE = re.compile(r"address already in use|bind: address already in use", re.IGNORECASE)


def address_in_use(log_text: str) -> bool:
    """Whether a process that exited said its port was taken (then its start is retried on new ports)."""
    return bool(_IN_USE.search(log_text))


def safe_name(name: str) -> str:
    """``name`` as a file name part (a ServiceAccount or node name: DNS labels, ``.``, ``:``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
