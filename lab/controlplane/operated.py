"""``lab.cluster.Cluster``'s surface over the REAL control plane, so that the operator's tests
(tests/component/test_controller_operator.py) run unchanged against kube-apiserver and
kube-controller-manager (tests/integration/test_controller_operator_real.py)::

    with RealCluster(cp, tmp_path, tag="t1") as c:
        c.add_node("node-a")                      # a NodeAgent's Node, named c.unique("node-a")
        ctl = c.start_controller(config)          # through a KubeProxy, in namespaces of its own
        c.apply(docs); c.get("v1", "ConfigMap", name, ns); c.kube.patch(...)

The control plane is shared by every test of a pytest worker's session: each ``RealCluster`` spells its
namespaces and nodes with its ``tag`` (``unique()``), runs the controller with a gateway namespace and a
leader-election namespace of its own, and on exit stops its controllers, releases its gateways'
finalizers and deletes its namespaces, pods and nodes. The project's CRDs (and Multus' NAD) are applied
idempotently (other tests apply and delete them too).

What it does not offer is the emulator's own powers (``kube.inject_fault``, ``compact``,
``close_watches``, ``unreachable``, ``requests``): those raise ``NotImplementedError``; the proxy
(``proxy``) has the real-server counterparts (docs/controlplane.md, "Faults: the proxy")."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import httpx
import yaml

from controller.names import LABEL_TENANT, TENANT_ENABLED, GatewayKey
from gwkit.kube.client import BY_KIND, Resource
from lab.cluster import Cluster, Controller, crd_documents
from lab.controlplane.cluster import ControlPlane
from lab.controlplane.nodeagent import NodeAgent
from lab.controlplane.proxy import KubeProxy
from lab.kubeapi import KubeAPIThread
from lab.kubeapi.errors import ApiError
from lab.wait import wait_for

MERGE = "application/merge-patch+json"
GATEWAY_KINDS = ("VPNGateway", "IPsecGateway")


def resource(api_version: str, kind: str) -> Resource:
    r = BY_KIND[kind]
    if r.api_version != api_version:
        raise KeyError(f"{api_version}/{kind}: not a resource this project knows")
    return r


class RealKube(KubeAPIThread):
    """The part of ``KubeAPIThread``'s Python API the operator's tests use, as an admin client of the
    real API server (directly, not through the proxy: the proxy's log is the controller's)."""

    def __init__(self, cp: ControlPlane) -> None:  # no emulator: nothing of KubeAPIThread's state
        self.cp = cp
        self.http = cp.client()

    def close(self) -> None:
        self.http.close()

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    @staticmethod
    def _check(r: httpx.Response) -> dict[str, Any]:
        """The answer's object; a failure as the emulator raises it (``ApiError``, from the Status)."""
        if r.status_code >= 400:
            try:
                st = r.json()
            except ValueError:  # a plain-text answer (Go's http.NotFound: a CRD's endpoint not served)
                st = {"message": r.text}
            reason, message = str(st.get("reason") or ""), str(st.get("message") or "")
            raise ApiError(r.status_code, reason, message, st.get("details"))
        return r.json()  # type: ignore[no-any-return]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = resource(obj["apiVersion"], obj["kind"])
        ns = (obj.get("metadata") or {}).get("namespace") if res.namespaced else None
        return self._check(self.http.post(res.path(ns), json=obj))

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        res = resource(api_version, kind)
        r = self.http.get(res.path(namespace or None, name))
        return None if r.status_code == 404 else self._check(r)

    def list(self, api_version: str, kind: str, namespace: str = "") -> list[dict[str, Any]]:
        res = resource(api_version, kind)
        r = self.http.get(res.path(namespace or None))
        if r.status_code == 404:  # a CRD's endpoint not served (yet)
            return []
        return list(self._check(r)["items"])

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str = "",
        subresource: str = "",
        content_type: str = MERGE,
    ) -> dict[str, Any]:
        res = resource(api_version, kind)
        r = self.http.patch(
            res.path(namespace or None, name, subresource or None),
            json=patch,
            headers={"Content-Type": content_type},
        )
        return self._check(r)

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str = "", propagation: str = ""
    ) -> dict[str, Any]:
        res = resource(api_version, kind)
        body = {"propagationPolicy": propagation} if propagation else None
        r = self.http.request("DELETE", res.path(namespace or None, name), json=body)
        return self._check(r)

    def _emulator_only(self, *_: Any, **__: Any) -> NoReturn:
        raise NotImplementedError("an emulator power: on the real server, use RealCluster.proxy")

    requests = inject_fault = compact = close_watches = unreachable = wait_reachable = _emulator_only


class RealCluster(Cluster):
    """See the module's docstring. ``proxy``: the controller's way to the API server (its log and
    faults); ``kube``: the test's admin client; ``gateways``: the gateway namespace."""

    def __init__(self, cp: ControlPlane, workdir: Path, *, tag: str) -> None:
        # Not Cluster.__init__: no emulator. The attributes Cluster's methods use, over the real server.
        self.workdir = workdir
        self.gateway_namespace = True
        self.controllers: list[Controller] = []
        self.cp = cp
        self.tag = tag
        self.kube: RealKube = RealKube(cp)
        self.proxy = KubeProxy(cp, name=f"kube-proxy-{tag}")
        self.gateways = self.unique("vpngw-gateways")
        self.system = self.unique("vpngw-system")
        self.nodes: dict[str, NodeAgent] = {}

    def unique(self, name: str) -> str:
        """``name`` (a namespace or a node) as this cluster spells it: the test's own."""
        return f"{name}-{self.tag}"

    def __enter__(self) -> RealCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proxy.start()
        try:
            crds = crd_documents()
            self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds))
            names = [f"crd/{c['metadata']['name']}" for c in crds]
            self.cp.kubectl("wait", "--for=condition=established", "--timeout=60s", *names)
            self.namespace(self.system, tenant=False)
            # As the chart makes it: the gateway pods are privileged (docs/install.md).
            self.namespace(
                self.gateways, tenant=False, labels={"pod-security.kubernetes.io/enforce": "privileged"}
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        for c in self.controllers:
            with contextlib.suppress(Exception):
                c.stop(signal.SIGTERM, timeout=10)
        with contextlib.suppress(Exception):
            self._release_gateways()
        ours = self.namespaces()
        for ns in ours:
            self.cp.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        # No kubelet confirms a pod's deletion: what one would do (the ReplicaSet controller made the
        # gateway pods from the controller's Deployments), so that the namespaces go.
        for ns in ours:
            self.cp.kubectl("delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0", check=False)
        for name, agent in self.nodes.items():
            agent.silence()
            self.cp.kubectl("delete", "node", name, "--wait=false", "--ignore-not-found", check=False)
        self.proxy.close()
        self.kube.close()

    def _release_gateways(self) -> None:
        """Every gateway CR of the test's namespaces deleted without its finalizer (its controller is
        stopped), and gone before the next test: a CR left with it would hold its namespace in Terminating
        for good, and one still there when the next test's controller starts is one more gateway to it
        (each controller watches every namespace)."""
        for kind in GATEWAY_KINDS:
            res = BY_KIND[kind]
            for ns in self.namespaces():
                for gw in self.kube.list(res.api_version, kind, ns):
                    name = gw["metadata"]["name"]
                    if gw["metadata"].get("finalizers"):
                        self.kube.patch(res.api_version, kind, name, {"metadata": {"finalizers": None}}, ns)
                    with contextlib.suppress(ApiError):
                        self.kube.delete(res.api_version, kind, name, ns)

        def gone() -> bool:
            return not any(
                self.kube.list(BY_KIND[k].api_version, k, ns)
                for k in GATEWAY_KINDS
                for ns in self.namespaces()
            )

        wait_for(gone, 30, "the test's gateways deleted")

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig, straight to the API server (the test's identity)."""
        return self.cp.kubeconfig

    def namespace(self, name: str, *, tenant: bool = True, labels: Mapping[str, str] | None = None) -> None:
        if self.kube.get("v1", "Namespace", name) is None:
            md: dict[str, Any] = {"name": name, "labels": {**(labels or {})}}
            if tenant:
                md["labels"][LABEL_TENANT] = TENANT_ENABLED
            self.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": md})

    def namespaces(self) -> list[str]:
        """The namespaces of this cluster's spelling (``unique()``), whoever made them."""
        suffix = self.unique("")
        return [
            n["metadata"]["name"]
            for n in self.kube.list("v1", "Namespace")
            if n["metadata"]["name"].endswith(suffix)
        ]

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        """Create each document (its namespace first), as an admin client would; a CRD's endpoint that
        is not served yet (a moment after the CRD is Established) is waited for."""
        for d in docs:
            ns = (d.get("metadata") or {}).get("namespace")
            if ns:
                self.namespace(str(ns))
            doc = dict(d)

            def created(doc: dict[str, Any] = doc) -> bool:
                try:
                    self.kube.create(doc)
                except ApiError as exc:
                    if exc.code == 404:
                        return False
                    raise
                return True

            wait_for(created, 30, f"{d['kind']} created (once its endpoint is served)")

    def add_node(
        self,
        name: str,
        *,
        ready: bool = True,
        labels: Mapping[str, str] | None = None,
        provider_id: str | None = None,
    ) -> None:
        """A Node as a kubelet registers it (``NodeAgent``, heart-beating), named ``name`` as given: the
        caller spells it with ``unique()``."""
        agent = NodeAgent(self.cp, name, interval=1.0)
        self.nodes[name] = agent
        base = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        agent.register(ready=ready, labels={**base, **(labels or {})}, provider_id=provider_id)

    def set_node_ready(self, name: str, ready: bool) -> None:
        """What the node's kubelet posts: Ready, or NotReady (its container runtime down)."""
        self.nodes[name].set_ready(ready)

    def owned(
        self, api_version: str, kind: str, gateway: str, namespace: str, gateway_kind: str = "VPNGateway"
    ) -> dict[str, Any] | None:
        return self.kube.get(api_version, kind, *self.home_of(gateway, namespace, gateway_kind))

    def home_of(self, gateway: str, namespace: str, gateway_kind: str = "VPNGateway") -> tuple[str, str]:
        return GatewayKey(gateway_kind, namespace, gateway).home_name, self.gateways  # type: ignore[arg-type]

    def start_controller(
        self,
        config: Mapping[str, Any] | None = None,
        *args: str,
        name: str = "controller",
        env: Mapping[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> Controller:
        """The controller as ``Cluster.start_controller`` runs it, as the admin through ``proxy``, in
        this cluster's gateway and leader-election namespaces."""
        via = kubeconfig or self.proxy.kubeconfig(
            self.cp.kubeconfig, self.workdir / f"{name}-proxy.kubeconfig"
        )
        ours = ("--gateway-namespace", self.gateways, "--leader-election-namespace", self.system)
        return super().start_controller(config, *ours, *args, name=name, env=env, kubeconfig=via)
