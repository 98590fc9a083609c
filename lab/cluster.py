"""An emulated cluster for tests, benchmarks and the demo: the Kubernetes API EMULATOR (``lab.kubeapi``)
with the project's CRDs and Multus' NAD CRD installed, nodes as a kubelet would register them, and the
real controller (``python -m controller run``) as a process against it.

Nothing here is Kubernetes: it is the lab's stand-in for one, faithful where the controller depends on it
(docs/kubeapi.md). Every process and temporary file is removed on every exit path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from controller.names import LABEL_TENANT, TENANT_ENABLED, GatewayKey
from controller.settings import Settings
from gwplan import SECRET_OPT_IN_LABEL
from lab import ports
from lab.kubeapi import KubeAPIThread
from lab.wait import wait_for as wait_for  # re-exported: lab.kubelet.world imports it from here

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = Path(__file__).resolve().parent / "manifests"
GATEWAY_NAMESPACE = Settings.gateway_namespace
"""The operator's gateway namespace, as the chart makes it (the controller's default)."""


def crd_documents() -> list[dict[str, Any]]:
    from controller.api.crds import crds

    nad = yaml.safe_load((MANIFESTS / "network-attachment-definition.yaml").read_text())
    return [*crds(), nad]


def node(
    name: str, *, ready: bool = True, labels: Mapping[str, str] | None = None, provider_id: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if provider_id:
        spec["providerID"] = provider_id
    return {
        "apiVersion": "v1",
        "kind": "Node",
        # The well-known labels every kubelet registers (pkg/kubelet/kubelet_node_status.go, initialNode):
        # the chart's default nodeSelector is kubernetes.io/os=linux.
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": spec,
    }


LISTENING = "operator.listening"
"""The controller's log line with the port its ``--listen 127.0.0.1:0`` got."""


class Controller:
    """``python -m controller run --listen 127.0.0.1:0`` as a child process (its log in ``log_path``):
    it binds a port of its own and announces it in its log (``lab.ports``: no port is picked for it)."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self._port: int | None = None

    def announced_port(self) -> int | None:
        """The port from the controller's ``operator.listening`` line; None before it is logged."""
        if self._port is None:
            self._port = ports.announced_port(self.log(), LISTENING)
        return self._port

    @property
    def port(self) -> int:
        """The controller's HTTP port, waiting (up to 30 s) for its announcement."""
        if (port := self.announced_port()) is not None:
            return port
        self._port = ports.wait_announced_port(
            self.log, LISTENING, alive=lambda: self.proc.poll() is None, timeout=30, what="the controller"
        )
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:  # noqa: S310 (our own loopback)
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def ready(self) -> bool:
        if self.announced_port() is None:
            return False  # not listening yet (or never: see ``proc``)
        try:
            return self.get("/readyz")[0] == 200
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


class Cluster:
    """``with Cluster(tmp) as c: c.add_node("node-a"); ctl = c.start_controller(config)``."""

    def __init__(
        self,
        workdir: Path,
        *,
        bookmark_interval: float = 1.0,
        history: int = 10000,
        sans: Sequence[str] = (),
        gateway_namespace: bool = True,
    ) -> None:
        """``sans``: extra names/addresses for the emulator's certificate (e.g. the API's in-cluster
        address 10.96.0.1, which the lab kubelet's pods use). ``gateway_namespace``: make the operator's
        gateway namespace, as the chart does (off: a test installs the chart itself)."""
        self.workdir = workdir
        self.gateway_namespace = gateway_namespace
        self.kube = KubeAPIThread(bookmark_interval=bookmark_interval, history=history, sans=tuple(sans))
        self.controllers: list[Controller] = []

    def __enter__(self) -> Cluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kube.__enter__()
        try:
            for doc in crd_documents():
                self.kube.create(doc)
            for ns in (
                "vpngw-system",
                "monitoring",
                *([GATEWAY_NAMESPACE] if self.gateway_namespace else []),
            ):
                self.namespace(ns, tenant=False)
        except BaseException:
            self.kube.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        for c in self.controllers:
            with contextlib.suppress(Exception):
                c.stop(signal.SIGKILL, timeout=10)
        self.kube.__exit__(et, ev, tb)

    @property
    def kubeconfig(self) -> Path:
        return self.kube.kubeconfig

    def namespace(self, name: str, *, tenant: bool = True) -> None:
        """Create namespace ``name`` if it is missing; ``tenant``: enabled for gateways, as the platform
        does for a tenant (``vpn.bnerd.net/tenant=enabled``)."""
        if self.kube.get("v1", "Namespace", name) is None:
            md: dict[str, Any] = {"name": name}
            if tenant:
                md["labels"] = {LABEL_TENANT: TENANT_ENABLED}
            self.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": md})

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        """Create each document (its namespace first), as an admin client would."""
        for d in docs:
            ns = (d.get("metadata") or {}).get("namespace")
            if ns:
                self.namespace(str(ns))
            self.kube.create(dict(d))

    def add_node(
        self,
        name: str,
        *,
        ready: bool = True,
        labels: Mapping[str, str] | None = None,
        provider_id: str | None = None,
    ) -> None:
        self.kube.create(node(name, labels=labels, provider_id=provider_id))
        self.set_node_ready(name, ready)

    def set_node_ready(self, name: str, ready: bool) -> None:
        """What a kubelet (or the node controller, for a lost node) writes to the node's status."""
        status = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                }
            ]
        }
        self.kube.patch("v1", "Node", name, {"status": status}, subresource="status")

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        return self.kube.get(api_version, kind, name, namespace)

    def owned(
        self, api_version: str, kind: str, gateway: str, namespace: str, gateway_kind: str = "VPNGateway"
    ) -> dict[str, Any] | None:
        """The gateway's object of ``kind`` in the gateway namespace (where its pod and plan live)."""
        return self.kube.get(api_version, kind, *home_of(gateway, namespace, gateway_kind))

    def start_controller(
        self,
        config: Mapping[str, Any] | None = None,
        *args: str,
        name: str = "controller",
        env: Mapping[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> Controller:
        cfg = self.workdir / f"{name}-config.yaml"
        cfg.write_text(yaml.safe_dump(dict(config or {})))
        log_path = self.workdir / f"{name}.log"
        argv = [
            sys.executable,
            "-m",
            "controller",
            "run",
            "--kubeconfig",
            str(kubeconfig or self.kubeconfig),
            "--config",
            str(cfg),
            "--listen",
            "127.0.0.1:0",
            *args,
        ]
        environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        with log_path.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=environ)
        ctl = Controller(proc, log_path)
        self.controllers.append(ctl)
        return ctl


def home_of(gateway: str, namespace: str, gateway_kind: str = "VPNGateway") -> tuple[str, str]:
    """(name, namespace) of a gateway's objects in the gateway namespace (``GatewayKey.home_name``)."""
    return GatewayKey(gateway_kind, namespace, gateway).home_name, GATEWAY_NAMESPACE  # type: ignore[arg-type]


def gateway_secret(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """A Secret its owner opted in for gateways (the label the controller and the pod require)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {SECRET_OPT_IN_LABEL: "true"}},
        "stringData": dict(data),
    }


def secret_refs(docs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(namespace, Secret name) -> keys, of every ``...SecretRef`` in ``docs`` (a certificateSecretRef
    names a kubernetes.io/tls Secret: tls.crt, tls.key, ca.crt)."""
    out: dict[tuple[str, str], set[str]] = {}

    def walk(node: Any, ns: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k.endswith("SecretRef") and isinstance(v, Mapping) and isinstance(v.get("name"), str):
                    keys = (
                        {"tls.crt", "tls.key", "ca.crt"}
                        if k == "certificateSecretRef"
                        else {str(v.get("key"))}
                    )
                    out.setdefault((ns, v["name"]), set()).update(keys)
                else:
                    walk(v, ns)
        elif isinstance(node, list):
            for v in node:
                walk(v, ns)

    for d in docs:
        walk(d.get("spec"), str((d.get("metadata") or {}).get("namespace")))
    return out


def secrets_for(docs: Sequence[Mapping[str, Any]], value: str = "lab-only-secret") -> list[dict[str, Any]]:
    """Opted-in Secrets for every Secret ``docs`` reference, each key holding ``value`` (for the
    controller's tests: it checks names and labels, never values)."""
    return [
        gateway_secret(ns, name, dict.fromkeys(sorted(keys), value))
        for (ns, name), keys in sorted(secret_refs(docs).items())
    ]


def clouds_yaml(path: Path, network_url: str, compute_url: str, name: str = "lab") -> Path:
    """A clouds.yaml for a noauth Neutron (and Nova's os-interface emulator) at these URLs."""
    doc = {
        "clouds": {
            name: {
                "auth_type": "none",
                "auth": {"endpoint": network_url.rstrip("/")},
                "network_endpoint_override": network_url.rstrip("/"),
                "compute_endpoint_override": compute_url.rstrip("/") + "/v2.1",
                "region_name": "RegionOne",
            }
        }
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def openstack_args(
    gateway_network: str, gateway_subnet: str, external_network: str, cloud: str = "lab"
) -> list[str]:
    """The controller's flags for the OpenStack backend against a ``clouds_yaml`` cloud."""
    return [
        "--cloud",
        "openstack",
        "--os-cloud",
        cloud,
        "--gateway-network",
        gateway_network,
        "--gateway-subnet",
        gateway_subnet,
        "--external-network",
        external_network,
    ]


@contextlib.contextmanager
def cluster(workdir: Path, **kw: Any) -> Iterator[Cluster]:
    with Cluster(workdir, **kw) as c:
        yield c
