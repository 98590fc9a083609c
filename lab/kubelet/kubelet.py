"""The lab kubelet: plays one node's kubelet (and the cluster controllers the emulator lacks) for the
Kubernetes API emulator. **An emulator of a kubelet, not one**: docs/e2e.md says what it does as the
kubelet does and what it simplifies; tests/integration/test_e2e_kubelet.py is its contract.

One ``LabKubelet`` per node, on one event loop:

* the Deployment loop (the emulator has no Deployment controller): one replica per Deployment,
  strategy Recreate (the old pod terminated before the new one is created), the ServiceAccount
  admission's token volume added, the ``kube-root-ca.crt`` ConfigMap published in the namespace;
  Deployment status written;
* the pods bound to this node (``spec.nodeName``), each run by a ``PodWorker`` (lab/kubelet/pod.py);
* the cluster services the node's pods use, inside the node's network namespace (``services``): the API
  server's in-cluster address relayed to the emulator, cluster DNS;
* the informer caches of ConfigMaps and Secrets the volumes and environment read.

``LabKubeletThread`` runs it on its own thread for synchronous tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import tempfile
from concurrent.futures import Future
from ipaddress import IPv4Network
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
from anyio.from_thread import BlockingPortal, start_blocking_portal

from gwkit.kube import Conflict, KubeClient, KubeError, NotFound, load
from gwkit.kube.client import CONFIGMAPS, DEPLOYMENTS, NADS, NODES, PODS, SECRETS, SERVICEACCOUNTS
from lab import netns
from lab.kubelet import adapt, model, volumes
from lab.kubelet.cache import Cache
from lab.kubelet.nsnet import listener_in
from lab.kubelet.pod import PodWorker, random_suffix
from lab.kubelet.runtime import ContainerRun, Mount, PodmanRuntime, ProcessRuntime, podman, podman_sync
from lab.kubelet.sandbox import NodeNetwork
from lab.kubelet.services import RelayGate, serve_dns, serve_relay
from lab.kubelet.settings import KubeletSettings

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class LabKubelet:
    def __init__(
        self, settings: KubeletSettings, kubeconfig: Path, api_target: tuple[str, int], ca_file: Path
    ) -> None:
        self.settings = settings
        self.kubeconfig = kubeconfig
        self.api_target = api_target
        self.ca_pem = ca_file.read_text()
        self.run_id = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        # Under /tmp whatever ``workdir`` says: a pod's sockets (charon's VICI socket on an emptyDir) must
        # fit AF_UNIX's 108 bytes from the node's side too. ``keep_logs`` copies the logs to ``workdir``.
        self.root = Path(tempfile.gettempdir()) / f"{self.run_id}-kubelet"
        self.node_network = NodeNetwork(
            settings.node_ns, IPv4Network(settings.pod_cidr), (settings.api_address, settings.dns_address)
        )
        self.runtime: ProcessRuntime | PodmanRuntime = (
            ProcessRuntime() if settings.runtime == "process" else PodmanRuntime(self.run_id)
        )
        self.runtime_default_user = 0
        self.workers: dict[str, PodWorker] = {}
        """By pod uid."""
        self.finished: dict[str, PodWorker] = {}
        self.dns_records = dict(settings.dns_records)
        self._stop = anyio.Event()
        self._kube: KubeClient | None = None
        self._pod_changed = anyio.Event()
        self.lab_conf = self.root / "lab-strongswan.conf"
        self.partitioned = False
        """``partition()``: the node is cut off from the API server, its pods keep running."""
        self.relay_gate = RelayGate()

    @property
    def kube(self) -> KubeClient:
        assert self._kube is not None
        return self._kube

    def stop(self) -> None:
        self._stop.set()

    def partition(self) -> None:
        """The node loses the API server (a network partition; call on the kubelet's loop): from now on
        it writes nothing (no pod status, no deletion confirmed), acts on no change it would have seen,
        and its pods' connections to the API server through the relay are cut, new ones refused. Its
        pods keep running as they are, as on a real partitioned node. Not undone."""
        self.partitioned = True
        self.relay_gate.close()
        log.info("kubelet.partitioned node=%s pods=%d", self.settings.node, len(self.workers))

    # --- the loop ------------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        removed = await anyio.to_thread.run_sync(cleanup_stale, self.settings.runtime == "podman")
        if removed:
            log.info("kubelet.stale_removed count=%d what=%r", len(removed), ", ".join(removed)[:500])
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        if self.settings.lab_charon:
            self.lab_conf.write_text(adapt.lab_strongswan_conf(adapt.IMAGE_STRONGSWAN_CONF.read_text()))
            self.lab_conf.chmod(0o644)
        config = await anyio.to_thread.run_sync(load, self.kubeconfig)
        self._kube = KubeClient(
            config, user_agent=f"lab-kubelet/{self.settings.node}", field_manager="lab-kubelet"
        )
        await anyio.to_thread.run_sync(self.node_network.setup)
        relay_sock = listener_in(self.settings.node_ns, self.settings.api_address, self.settings.api_port)
        dns_sock = listener_in(self.settings.node_ns, self.settings.dns_address, 53, socket.SOCK_DGRAM)
        try:
            async with anyio.create_task_group() as tg:
                self.configmaps = Cache(self.kube, CONFIGMAPS)
                self.secrets = Cache(self.kube, SECRETS)
                self.pods = Cache(
                    self.kube,
                    PODS,
                    field_selector=f"spec.nodeName={self.settings.node}",
                    on_change=lambda old, new: self._pod_changed.set(),
                )
                for cache in (self.configmaps, self.secrets, self.pods):
                    tg.start_soon(cache.run)
                await tg.start(serve_relay, relay_sock, self.api_target, self.relay_gate)
                await tg.start(serve_dns, dns_sock, self.dns_records)
                for cache in (self.configmaps, self.secrets, self.pods):
                    await cache.synced.wait()
                if self.settings.deployments:
                    self.deploy = DeploymentLoop(self)
                    await tg.start(self.deploy.run)
                tg.start_soon(self._pods_loop, tg)
                log.info(
                    "kubelet.started node=%s node_ns=%s runtime=%s api=%s:%d refresh_delay=%g",
                    self.settings.node,
                    self.settings.node_ns,
                    self.runtime.name,
                    self.settings.api_address,
                    self.settings.api_port,
                    self.settings.volume_refresh_delay,
                )
                task_status.started()
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._shutdown()
                relay_sock.close()
                dns_sock.close()

    async def _shutdown(self) -> None:
        workers = list(self.workers.values())
        for w in workers:
            w.stop(deleting=False)
        with anyio.move_on_after(120):
            for w in workers:
                await w.wait()
        for w in workers:
            self.finished[w.uid] = w
        self.workers.clear()
        if self.settings.runtime == "podman":
            await self.remove_pod_containers("")
        await anyio.to_thread.run_sync(self.node_network.teardown)
        await anyio.to_thread.run_sync(volumes.remove_tree, self.root)
        if self._kube is not None:
            await self._kube.aclose()
        log.info("kubelet.stopped node=%s", self.settings.node)

    async def _pods_loop(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            self._pod_changed = anyio.Event()
            if self.partitioned:  # what it would see from the API server, it does not
                await self._pod_changed.wait()
                continue
            seen = set()
            for pod in self.pods.values():
                md = pod["metadata"]
                uid = str(md.get("uid"))
                seen.add(uid)
                w = self.workers.get(uid)
                if md.get("deletionTimestamp"):
                    if w is not None:
                        w.stop(deleting=True)
                    elif uid not in self.finished and (
                        self.settings.deletion == "api"
                        or model.GRACEFUL_FINALIZER in (md.get("finalizers") or [])
                    ):
                        # Deleted before it ran here (or before this kubelet started): nothing to stop.
                        w = PodWorker(self, pod)
                        w.deleting = True
                        self.finished[uid] = w
                        tg.start_soon(w.confirm_deletion)
                    continue
                if w is None and uid not in self.finished:
                    w = PodWorker(self, pod)
                    self.workers[uid] = w
                    tg.start_soon(self._run_worker, w)
                elif w is not None:
                    w.update(pod)
            for uid, w in list(self.workers.items()):
                if uid not in seen:
                    w.stop(deleting=False)
            await self._pod_changed.wait()

    async def _run_worker(self, w: PodWorker) -> None:
        try:
            await w.run()
        finally:
            self.workers.pop(w.uid, None)
            self.finished[w.uid] = w
            self._pod_changed.set()

    # --- what pods need from the node ------------------------------------------------------------------

    async def nad(self, namespace: str, name: str) -> Obj | None:
        try:
            return await self.kube.get(NADS, name, namespace)
        except NotFound:
            return None

    async def ensure_root_ca(self, namespace: str) -> None:
        """What kube-controller-manager's root-ca-cert-publisher does: ``kube-root-ca.crt`` in a namespace."""
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": model.ROOT_CA_CONFIGMAP},
            "data": {"ca.crt": self.ca_pem},
        }
        with contextlib.suppress(Conflict):
            await self.kube.create(CONFIGMAPS, cm, namespace)

    async def ensure_default_service_account(self, namespace: str) -> None:
        """What kube-controller-manager's serviceaccounts controller does: ``default`` in a namespace."""
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        with contextlib.suppress(Conflict):
            await self.kube.create(SERVICEACCOUNTS, sa, namespace)

    def adapt_charon(self, run: ContainerRun) -> None:
        if self.runtime.name == "process":
            run.image_files["vpngw/strongswan.conf"] = self.lab_conf.read_bytes()
        else:
            run.mounts.append(Mount(str(self.lab_conf), adapt.STRONGSWAN_CONF_PATH, True))
            for host, inside in adapt.LIBIPSEC_FILES:
                run.mounts.append(Mount(host, inside, True))
        if adapt.TUN not in run.devices:
            run.devices.append(adapt.TUN)

    async def remove_pod_containers(self, prefix: str) -> None:
        res = await podman(
            "ps",
            "-a",
            "-q",
            "--filter",
            f"label=net.bnerd.vpn.test={self.run_id}",
            "--format",
            "{{.Names}}",
            check=False,
        )
        for name in res.stdout.decode().split():
            if name.startswith(prefix):
                await podman("rm", "-f", "-t", "0", name, check=False)

    # --- for tests ---------------------------------------------------------------------------------------

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        for w in [*self.workers.values(), *self.finished.values()]:
            if w.namespace == namespace and w.name == name:
                return w
        return None


class DeploymentLoop:
    """The Deployment (and ReplicaSet) controller the emulator lacks, for one-replica Recreate
    Deployments: pods are owned by the Deployment (no ReplicaSet in between). It also plays the
    scheduler for the pods it creates: a template without ``nodeName`` is bound, at creation, to the
    first node that fits (``model.schedule``: Ready, schedulable, nodeSelector and required node
    affinity, NoSchedule/NoExecute taints tolerated); with none the pod is created unbound and marked
    ``PodScheduled=False`` (``Unschedulable``), and is not retried."""

    def __init__(self, kubelet: LabKubelet) -> None:
        self.k = kubelet
        self._changed = anyio.Event()
        self.deployments = Cache(kubelet.kube, DEPLOYMENTS, on_change=self._poke)
        self.pods = Cache(kubelet.kube, PODS, on_change=self._poke)
        self.nodes = Cache(kubelet.kube, NODES)

    def _poke(self, old: Obj | None, new: Obj | None) -> None:
        self._changed.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            for cache in (self.deployments, self.pods, self.nodes):
                tg.start_soon(cache.run)
            for cache in (self.deployments, self.pods, self.nodes):
                await cache.synced.wait()
            task_status.started()
            while True:
                self._changed = anyio.Event()
                for d in self.deployments.values():
                    try:
                        await self.reconcile(d)
                    except KubeError as exc:
                        log.warning(
                            "kubelet.deployment_failed deployment=%s/%s error=%r",
                            d["metadata"]["namespace"],
                            d["metadata"]["name"],
                            str(exc),
                        )
                        self._changed.set()
                with anyio.move_on_after(1.0):  # also a periodic resync (retries what failed)
                    await self._changed.wait()

    def _owned(self, d: Obj) -> list[Obj]:
        uid = d["metadata"]["uid"]
        return [
            p
            for p in self.pods.values()
            if p["metadata"].get("namespace") == d["metadata"]["namespace"]
            and any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    async def reconcile(self, d: Obj) -> None:
        if d["metadata"].get("deletionTimestamp"):
            return
        ns = str(d["metadata"]["namespace"])
        pods = self._owned(d)
        step, names = model.deployment_step(d, pods)
        if step == "delete-old":
            for n in names:
                try:
                    await self.k.kube.delete(PODS, n, ns)
                    log.info(
                        "kubelet.deployment.pod_deleted deployment=%s/%s pod=%s", ns, d["metadata"]["name"], n
                    )
                except NotFound:
                    pass
        elif step == "create":
            await self.k.ensure_root_ca(ns)
            pod = model.pod_for(d, random_suffix(), random_suffix())
            unschedulable = ""
            if not pod["spec"].get("nodeName"):
                node, unschedulable = model.schedule(pod["spec"], self.nodes.values())
                if node is not None:
                    pod["spec"]["nodeName"] = node
            created = await self.k.kube.create(PODS, pod, ns)
            log.info(
                "kubelet.deployment.pod_created deployment=%s/%s pod=%s node=%s",
                ns,
                d["metadata"]["name"],
                created["metadata"]["name"],
                created["spec"].get("nodeName") or "-",
            )
            if unschedulable:
                log.warning(
                    "kubelet.scheduler.unschedulable pod=%s/%s message=%r",
                    ns,
                    created["metadata"]["name"],
                    unschedulable,
                )
                status = {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": unschedulable,
                        }
                    ],
                }
                await self.k.kube.patch(
                    PODS, created["metadata"]["name"], {"status": status}, ns, subresource="status"
                )
        status = model.deployment_status(d, pods)
        if {k: v for k, v in (d.get("status") or {}).items() if k in status} != status:
            with contextlib.suppress(NotFound):
                await self.k.kube.patch(
                    DEPLOYMENTS, d["metadata"]["name"], {"status": status}, ns, subresource="status"
                )


class LabKubeletThread:
    """``with LabKubeletThread(settings, kubeconfig, api_target, ca_file) as kubelet:`` the lab kubelet on
    its own thread; leaving stops every pod and removes everything it made."""

    def __init__(
        self, settings: KubeletSettings, kubeconfig: Path, api_target: tuple[str, int], ca_file: Path
    ) -> None:
        self.kubelet = LabKubelet(settings, kubeconfig, api_target, ca_file)
        self._portal_cm: Any = None
        self._portal: BlockingPortal | None = None
        self._future: Future[None] | None = None

    def __enter__(self) -> LabKubeletThread:
        self._portal_cm = start_blocking_portal(backend="asyncio")
        self._portal = self._portal_cm.__enter__()
        try:
            self._future, _ = self._portal.start_task(self.kubelet.run)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._portal is None:
            return
        try:
            self._portal.call(self.kubelet.stop)
            if self._future is not None:
                self._future.result(timeout=180)
        finally:
            self._portal_cm.__exit__(None, None, None)
            self._portal = None

    @property
    def portal(self) -> BlockingPortal:
        assert self._portal is not None
        return self._portal

    @property
    def run_id(self) -> str:
        return self.kubelet.run_id

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        return self.kubelet.worker(namespace, name)

    def pod_of(self, namespace: str, prefix: str) -> PodWorker | None:
        """The running worker of the pod whose name starts with ``prefix`` (a Deployment's name)."""
        for w in list(self.kubelet.workers.values()):
            if w.namespace == namespace and w.name.startswith(prefix + "-") and not w.deleting:
                return w
        return None

    def partition(self) -> None:
        """``LabKubelet.partition`` on the kubelet's loop."""
        self.portal.call(self.kubelet.partition)

    def take_host_device(self, mac: str, to_ns: str) -> list[str]:
        """What a cloud's fence does to this node: the interface with ``mac`` leaves the pod holding it
        (and the pod forgets it: its teardown will not move it back) or the node itself, and appears in
        network namespace ``to_ns`` (another node) under the name it had on this node. Returns the pods
        it was taken from (empty: it was on the node, or nowhere here)."""
        taken = []
        for w in [*self.kubelet.workers.values()]:
            if w.sandbox.take_host_device(mac, to_ns):
                taken.append(f"{w.namespace}/{w.name}")
        if not taken:
            self.kubelet.node_network.give_link(mac, to_ns)
        return taken

    def kill(self, namespace: str, name: str, container: str, sig: int = signal.SIGKILL) -> bool:
        w = self.worker(namespace, name)
        if w is None:
            return False
        return bool(self.portal.call(w.kill, container, sig))

    def set_dns(self, name: str, address: str) -> None:
        self.kubelet.dns_records[name.lower().rstrip(".")] = address

    def leftovers(self) -> list[str]:
        """What this kubelet made that still exists (empty after a clean exit)."""
        out = [f"netns {n}" for n in netns.list_namespaces() if n.startswith(self.run_id)]
        out += (
            [f"mount {m}" for m in volumes.mounts_under(self.kubelet.root)]
            if self.kubelet.root.exists()
            else []
        )
        if self.kubelet.root.exists():
            out.append(f"directory {self.kubelet.root}")
        if self.kubelet.settings.runtime == "podman":
            res = podman_sync("ps", "-a", "-q", "--filter", f"label=net.bnerd.vpn.test={self.run_id}")
            out += [f"container {c}" for c in res.stdout.split()]
        return out


def cleanup_stale(containers: bool = True) -> list[str]:
    """Leftovers of killed lab kubelets: their pods' network namespaces (and the container processes in
    them), tmpfs mounts, directories, podman containers (``containers``)."""
    import re
    import shutil

    from lab.kubelet.runtime import remove_stale_containers
    from lab.world import cleanup_stale as stale_namespaces

    removed = [f"netns {n}" for n in stale_namespaces()]
    for mp in volumes.stale_mounts():
        volumes.unmount(mp)
        removed.append(f"mount {mp}")
    if containers:
        removed += [f"container {c}" for c in remove_stale_containers()]
    pattern = re.compile(r"^vg(\d+)x[0-9a-f]+-kubelet$")
    for d in Path(tempfile.gettempdir()).iterdir():
        m = pattern.match(d.name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"directory {d}")
    return removed
