"""One pod on the lab kubelet's node, from admission to teardown (``PodWorker``).

Sequence (the kubelet's, simplified where docs/e2e.md says so):

1. admission: the pod's sysctls must be safe or in the kubelet's allowed unsafe list, else the pod is
   ``Failed`` with reason ``SysctlForbidden`` and nothing is created;
2. sandbox: network namespace, eth0, the pod's sysctls, Multus' attachments (host-device), the eth0
   egress capture, the ``network-status`` annotation;
3. volumes: ConfigMap, Secret, downwardAPI and projected (service-account token by TokenRequest,
   ``ca.crt``, namespace) through the atomic writer; emptyDir (tmpfs for ``medium: Memory``); hostPath.
   Changes of the ConfigMaps, Secrets and labels behind them are written ``volume_refresh_delay``
   seconds after the kubelet saw them (60 s by default: a real kubelet's sync period);
4. init containers one after another (a failed one is restarted with backoff, restartPolicy Always),
   then every container at once, each supervised: an exit is recorded (``lastState``, ``restartCount``)
   and restarted at once the first time, then after 10 s, 20 s, ... up to 300 s (CrashLoopBackOff);
   readiness, liveness and startup probes (httpGet and tcpSocket from the node, as the kubelet probes
   the pod's IP); a failed liveness probe restarts the container;
5. status: phase, conditions, container statuses, pod IP, patched on the status subresource when it
   changes, by a strategic merge patch of the difference to the pod as read, which replaces the kubelet's own
   conditions and keeps the others (``model.merged_status``, ``model.status_patch``);
6. teardown (the pod deleted, or the kubelet stopping): every container stopped (SIGTERM, then SIGKILL
   after terminationGracePeriodSeconds), host-device interfaces moved back to the node, the namespace,
   the veth and the volumes (tmpfs unmounted) removed, then the terminal phase written (Succeeded when
   every container exited 0, else Failed, with the containers' terminated states) and the deletion
   confirmed: the pod's finalizer released (the emulator) or the pod deleted with grace 0 (a real API
   server; ``settings.deletion``).
"""

from __future__ import annotations

import functools
import http.client
import logging
import secrets
import shutil
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from gwkit.kube import Conflict, KubeError, NotFound
from gwkit.kube.client import JSON_PATCH, PODS
from lab import netns
from lab.kubelet import adapt, model, volumes
from lab.kubelet.capture import EgressCapture
from lab.kubelet.nsnet import in_netns
from lab.kubelet.runtime import ContainerRun, Mount, Running, process_argv, process_image
from lab.kubelet.sandbox import Sandbox
from lab.kubelet.settings import PodHost

log = logging.getLogger(__name__)

Obj = dict[str, Any]
DEFAULT_CAPS = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
)
"""containerd's default capability set, for a container that does not drop ALL."""
IMAGE_GROUP_LINE = "vpngw:x:65532:\n"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Pending(Exception):
    """Not possible yet (a ConfigMap, Secret or ServiceAccount missing): retried, the pod waits."""


@dataclass
class Instance:
    """One running instance of a container."""

    running: Running
    started: float
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    killed_by: str = ""


@dataclass
class ProbeRecord:
    """One probe of one container, as the kubelet ran it (for tests: what answered, how often)."""

    successes: int = 0
    failures: int = 0
    last: str = ""


@dataclass
class Volume:
    name: str
    source: Obj
    path: Path
    kind: str
    written: model.Files | None = None
    pending_since: float | None = None


class PodWorker:
    def __init__(self, kubelet: PodHost, pod: Obj) -> None:
        self.k = kubelet
        self.pod = pod
        md = pod["metadata"]
        self.namespace = str(md["namespace"])
        self.name = str(md["name"])
        self.uid = str(md["uid"])
        short = self.uid.replace("-", "")[:8]
        self.dir = kubelet.root / "pods" / short
        self.netns = f"{kubelet.run_id}-p{short}"
        self.sandbox = Sandbox(self.netns, kubelet.node_network, f"veth{short}")
        self.capture: EgressCapture | None = None
        self.flows: dict[Any, Any] = {}
        self.view = model.PodView(
            host_ip=kubelet.settings.node_ip or str(kubelet.node_network.gateway.ip),
            init=tuple(self._initial(c) for c in self.spec.get("initContainers") or []),
            containers=tuple(
                self._initial(c, "ContainerCreating") for c in self.spec.get("containers") or []
            ),
        )
        self.volumes: dict[str, Volume] = {}
        self.instances: dict[str, Instance] = {}
        self.probes: dict[tuple[str, str], ProbeRecord] = {}
        """(container, ``readiness``/``liveness``/``startup``) -> its results so far."""
        self._stop = anyio.Event()
        self._done = anyio.Event()
        self._dirty = anyio.Event()
        self._scope = anyio.CancelScope()
        self.deleting = False
        self.started_at = time.monotonic()
        self.errors: list[str] = []
        self.token_expiration = model.TOKEN_EXPIRATION
        self._written: Obj | None = None
        """The status last written (the API server's, as far as this kubelet knows)."""

    # --- accessors -------------------------------------------------------------------------------------

    @property
    def spec(self) -> Obj:
        spec: Obj = self.pod.get("spec") or {}
        return spec

    def _initial(self, c: Obj, reason: str = "PodInitializing") -> model.ContainerState:
        return model.ContainerState(name=str(c["name"]), image=str(c.get("image", "")), reason=reason)

    def container_state(self, name: str) -> model.ContainerState | None:
        for c in (*self.view.init, *self.view.containers):
            if c.name == name:
                return c
        return None

    def _set(self, name: str, **kw: Any) -> None:
        self.view = replace(
            self.view,
            init=tuple(replace(c, **kw) if c.name == name else c for c in self.view.init),
            containers=tuple(replace(c, **kw) if c.name == name else c for c in self.view.containers),
        )
        self.mark()

    def mark(self) -> None:
        self._dirty.set()

    def update(self, pod: Obj) -> None:
        self.pod = pod

    # --- lifecycle -------------------------------------------------------------------------------------

    def stop(self, deleting: bool) -> None:
        self.deleting = self.deleting or deleting
        self._stop.set()
        self._scope.cancel()

    async def wait(self) -> None:
        await self._done.wait()

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._status_writer)
                with self._scope:
                    await self._start(tg)
                    await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._teardown()
                self._done.set()

    async def _start(self, tg: anyio.abc.TaskGroup) -> None:
        forbidden = model.forbidden_sysctls(self.spec, self.k.settings.allowed_unsafe_sysctls)
        if forbidden:
            msg = f"Pod forbidden sysctl: {', '.join(repr(f) for f in forbidden)} not allowlisted"
            self.view = replace(self.view, phase="Failed", reason="SysctlForbidden", message=msg)
            log.warning(
                "kubelet.pod.rejected pod=%s/%s reason=SysctlForbidden sysctls=%s",
                self.namespace,
                self.name,
                ",".join(forbidden),
            )
            self.mark()
            return
        self.view = replace(self.view, start_time=now())
        self.mark()
        self.dir.mkdir(parents=True, exist_ok=True)
        await self._with_retry("sandbox", self._make_sandbox)
        await self._with_retry("volumes", self._make_volumes)
        tg.start_soon(self._refresh_volumes)
        for c in self.spec.get("initContainers") or []:
            await self._supervise(c, init=True)
        self.view = replace(self.view, phase="Running")
        self.mark()
        for c in self.spec.get("containers") or []:
            tg.start_soon(self._supervise, c, False)

    async def _with_retry(self, what: str, fn: Any) -> None:
        failures = 0
        # A kubelet retries a pod's set-up step forever, with a back-off (a daemon's loop, no deadline
        # by design; allowed in tests/unit/test_no_polling_loops.py).
        while True:
            try:
                await fn()
                return
            except (Pending, KubeError, OSError, netns.LabError) as exc:
                failures += 1
                if failures in (1, 10) or failures % 50 == 0:
                    log.warning(
                        "kubelet.pod.waiting pod=%s/%s step=%s error=%r",
                        self.namespace,
                        self.name,
                        what,
                        str(exc),
                    )
                reason = "ContainerCreating"
                self.view = replace(
                    self.view,
                    containers=tuple(
                        replace(c, reason=reason, message=f"{what}: {exc}"[:300])
                        for c in self.view.containers
                    ),
                )
                self.mark()
                await anyio.sleep(min(2.0, 0.1 * failures))

    # --- sandbox ---------------------------------------------------------------------------------------

    async def _make_sandbox(self) -> None:
        if self.sandbox.ip is None:
            await anyio.to_thread.run_sync(self.sandbox.create, model.pod_sysctls(self.spec))
            self.capture = await anyio.to_thread.run_sync(
                EgressCapture, self.k.node_network.ns, self.sandbox.veth
            )
        attachments: list[model.Attachment] = []
        md = self.pod.get("metadata") or {}
        selections = model.network_selections(
            (md.get("annotations") or {}).get(model.NETWORKS_ANNOTATION), self.namespace
        )
        done = {m.pod_name for m in self.sandbox.moved}
        for ns, name, iface in selections:
            nad = await self.k.nad(ns, name)
            if nad is None:
                raise Pending(f"NetworkAttachmentDefinition {ns}/{name} not found")
            mac, dev = model.host_device(str((nad.get("spec") or {}).get("config") or "{}"))
            if iface not in done:
                await anyio.to_thread.run_sync(self.sandbox.attach_host_device, iface, mac, dev)
            attachments.append(model.Attachment(ns, name, iface, mac, dev))
        assert self.sandbox.ip is not None
        pod_ip = str(self.sandbox.ip.ip)
        self.view = replace(self.view, pod_ip=pod_ip, sandbox_ready=True)
        self.mark()
        status = model.network_status(pod_ip, attachments)
        if selections:
            await self.k.kube.patch(
                PODS,
                self.name,
                {"metadata": {"annotations": {model.NETWORK_STATUS_ANNOTATION: status}}},
                self.namespace,
            )

    # --- volumes ---------------------------------------------------------------------------------------

    def volume_path(self, name: str) -> Path:
        return self.dir / "volumes" / name

    async def _make_volumes(self) -> None:
        for v in self.spec.get("volumes") or []:
            name = str(v["name"])
            if name in self.volumes:
                continue
            path = self.volume_path(name)
            if "emptyDir" in v:
                ed = v["emptyDir"] or {}
                memory, size = ed.get("medium") == "Memory", ed.get("sizeLimit")
                await anyio.to_thread.run_sync(
                    functools.partial(volumes.empty_dir, path, memory=memory, size_limit=size)
                )
                self.volumes[name] = Volume(name, v, path, "emptyDir")
            elif "hostPath" in v:
                self.volumes[name] = Volume(name, v, Path(str(v["hostPath"]["path"])), "hostPath")
            else:
                kind = next((k for k in ("configMap", "secret", "downwardAPI", "projected") if k in v), None)
                if kind is None:
                    raise Pending(f"volume {name}: type not supported by the lab kubelet")
                vol = Volume(name, v, path, kind)
                payload = await self._payload(vol)
                await anyio.to_thread.run_sync(volumes.write_atomic, path, payload)
                vol.written = payload
                self.volumes[name] = vol

    async def _payload(self, vol: Volume) -> model.Files:
        src = vol.source[vol.kind] or {}
        if vol.kind == "configMap":
            cm = self.k.configmaps.get(self.namespace, str(src.get("name")))
            if cm is None:
                if src.get("optional"):
                    return {}
                raise Pending(f'configmap "{src.get("name")}" not found')
            return model.configmap_files(cm, src)
        if vol.kind == "secret":
            s = self.k.secrets.get(self.namespace, str(src.get("secretName")))
            if s is None:
                if src.get("optional"):
                    return {}
                raise Pending(f'secret "{src.get("secretName")}" not found')
            return model.secret_files(s, src)
        if vol.kind == "downwardAPI":
            return model.downward_files(self.pod, src)
        return await self._projected(src, vol)

    async def _projected(self, src: Obj, vol: Volume) -> model.Files:
        mode = int(src.get("defaultMode", 0o644))
        out: model.Files = {}
        for s in src.get("sources") or []:
            if "serviceAccountToken" in s:
                sat = s["serviceAccountToken"]
                path = str(sat.get("path", "token"))
                if vol.written and path in vol.written:
                    out[path] = vol.written[path]  # the token is not renewed within a lab's lifetime
                    continue
                token = await self._token(
                    int(sat.get("expirationSeconds", model.TOKEN_EXPIRATION)), sat.get("audience")
                )
                out[path] = (token.encode(), mode)
            elif "configMap" in s:
                ref = s["configMap"]
                cm = self.k.configmaps.get(self.namespace, str(ref.get("name")))
                if cm is None:
                    if ref.get("name") == model.ROOT_CA_CONFIGMAP:
                        await self.k.ensure_root_ca(self.namespace)
                    raise Pending(f'configmap "{ref.get("name")}" not found')
                out.update(model.configmap_files(cm, ref, mode))
            elif "secret" in s:
                ref = s["secret"]
                sec = self.k.secrets.get(self.namespace, str(ref.get("name")))
                if sec is None:
                    raise Pending(f'secret "{ref.get("name")}" not found')
                out.update(model.secret_files(sec, ref, mode))
            elif "downwardAPI" in s:
                out.update(model.downward_files(self.pod, s["downwardAPI"], mode))
        return out

    async def _token(self, expiration: int, audience: str | None) -> str:
        sa = str(self.spec.get("serviceAccountName") or "default")
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": expiration,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.name, "uid": self.uid},
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token"
        try:
            answer = await self.k.kube.request("POST", path, body=body)
        except NotFound as exc:
            if sa == "default":  # what the ServiceAccount controller makes in every namespace
                await self.k.ensure_default_service_account(self.namespace)
            raise Pending(f'serviceaccount "{sa}" not found') from exc
        return str((answer.get("status") or {}).get("token") or "")

    async def _refresh_volumes(self) -> None:
        delay = self.k.settings.volume_refresh_delay
        # The kubelet's periodic volume sync (a daemon's loop, not a wait for a condition;
        # allowed in tests/unit/test_no_polling_loops.py).
        while True:
            await anyio.sleep(min(1.0, max(0.05, delay / 4)))
            for vol in list(self.volumes.values()):
                if vol.kind in ("emptyDir", "hostPath"):
                    continue
                try:
                    payload = await self._payload(vol)
                except (Pending, KubeError):
                    continue  # a deleted ConfigMap or Secret: the volume keeps its last content
                if payload == vol.written:
                    vol.pending_since = None
                    continue
                t = time.monotonic()
                if vol.pending_since is None:
                    vol.pending_since = t
                    log.info(
                        "kubelet.volume.change_seen pod=%s/%s volume=%s apply_in=%.0f",
                        self.namespace,
                        self.name,
                        vol.name,
                        delay,
                    )
                if t - vol.pending_since >= delay:
                    await anyio.to_thread.run_sync(volumes.write_atomic, vol.path, payload)
                    vol.written, vol.pending_since = payload, None
                    log.info(
                        "kubelet.volume.updated pod=%s/%s volume=%s", self.namespace, self.name, vol.name
                    )

    # --- containers ------------------------------------------------------------------------------------

    def _lookup(self, c: Obj) -> model.Lookup:
        out: dict[tuple[str, str], Mapping[str, str] | None] = {}
        refs: list[tuple[str, str]] = []
        for src in c.get("envFrom") or []:
            if src.get("configMapRef"):
                refs.append(("configmap", str(src["configMapRef"].get("name"))))
            if src.get("secretRef"):
                refs.append(("secret", str(src["secretRef"].get("name"))))
        for var in c.get("env") or []:
            vf = var.get("valueFrom") or {}
            if "configMapKeyRef" in vf:
                refs.append(("configmap", str(vf["configMapKeyRef"].get("name"))))
            if "secretKeyRef" in vf:
                refs.append(("secret", str(vf["secretKeyRef"].get("name"))))
        for kind, name in refs:
            if kind == "configmap":
                cm = self.k.configmaps.get(self.namespace, name)
                out[(kind, name)] = (
                    None if cm is None else {k: str(v) for k, v in (cm.get("data") or {}).items()}
                )
            else:
                s = self.k.secrets.get(self.namespace, name)
                out[(kind, name)] = (
                    None
                    if s is None
                    else {k: v.decode(errors="replace") for k, v in model.secret_data(s).items()}
                )
        return out

    def _security(self, c: Obj) -> tuple[int, int, list[int], list[str] | None, bool, bool]:
        pod_sc = self.spec.get("securityContext") or {}
        sc = c.get("securityContext") or {}
        default_user = self.k.runtime_default_user
        user = int(sc.get("runAsUser", pod_sc.get("runAsUser", default_user)))
        group = int(
            sc.get("runAsGroup", pod_sc.get("runAsGroup", default_user if "runAsUser" not in sc else user))
        )
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and user == 0:
            raise model.EnvError("container has runAsNonRoot and image will run as root")
        groups = [int(g) for g in pod_sc.get("supplementalGroups") or []]
        if "fsGroup" in pod_sc:
            groups.append(int(pod_sc["fsGroup"]))
        privileged = bool(sc.get("privileged"))
        caps: list[str] | None
        if privileged:
            caps = None
        else:
            cc = sc.get("capabilities") or {}
            drop = {str(x).upper() for x in cc.get("drop") or []}
            add = [str(x).upper() for x in cc.get("add") or []]
            base = [] if "ALL" in drop else [x for x in DEFAULT_CAPS if x not in drop]
            caps = [*base, *(x for x in add if x not in base)]
        no_new_privs = sc.get("allowPrivilegeEscalation") is False
        readonly = bool(sc.get("readOnlyRootFilesystem"))
        return user, group, groups, caps, no_new_privs, readonly

    def _container_run(self, c: Obj, instance: int) -> ContainerRun:
        name = str(c["name"])
        base = {
            **model.service_env(self.k.settings.api_address, self.k.settings.api_port),
            "HOSTNAME": self.name,
        }
        known = {
            **self.pod,
            "status": {
                **(self.pod.get("status") or {}),
                "podIP": self.view.pod_ip,
                "hostIP": self.view.host_ip,
            },
        }
        env = model.container_env(c, known, self._lookup(c), base)
        process = self.k.runtime.name == "process"
        image = process_image(str(c.get("image", ""))) if process else None
        if image is not None:
            argv = process_argv(model.command_line(c, env, image.entrypoint, image.cmd))
            if not argv:
                raise model.EnvError("no command: neither the container nor its image names one")
        else:
            argv = model.command_line(c, env)
        user, group, groups, caps, nnp, readonly = self._security(c)
        mounts: list[Mount] = []
        devices: list[str] = []
        for m in c.get("volumeMounts") or []:
            vol = self.volumes.get(str(m["name"]))
            if vol is None:
                raise model.EnvError(f"volume {m['name']!r} not found")
            source = vol.path / str(m["subPath"]) if m.get("subPath") else vol.path
            ro = bool(m.get("readOnly")) or vol.kind in ("configMap", "secret", "downwardAPI", "projected")
            if vol.kind == "hostPath" and (
                vol.source["hostPath"].get("type") == "CharDevice" or source.is_char_device()
            ):
                devices.append(str(m["mountPath"]) if str(m["mountPath"]) == str(source) else str(source))
                continue
            mounts.append(Mount(str(source), str(m["mountPath"]), ro))
        dns = self.spec.get("dnsPolicy", "ClusterFirst")
        resolv = (
            model.resolv_conf(self.namespace, self.k.settings.dns_address, self.k.settings.cluster_domain)
            if dns in ("ClusterFirst", "ClusterFirstWithHostNet")
            else Path("/etc/resolv.conf").read_text()
        )
        pod_ip = self.view.pod_ip
        etc = {
            "resolv.conf": resolv.encode(),
            "hosts": model.hosts_file(pod_ip, self.name).encode(),
            "hostname": f"{self.name}\n".encode(),
        }
        image_files: dict[str, bytes] = {}
        if image is not None and image.gateway_etc:
            group_file = Path("/etc/group").read_text()
            if "\nvpngw:" not in "\n" + group_file:
                group_file += IMAGE_GROUP_LINE
            image_files["group"] = group_file.encode()
            image_files["vpngw/strongswan.conf"] = adapt.IMAGE_STRONGSWAN_CONF.read_bytes()
        key = f"{self.netns}-{name}-{instance}"
        run = ContainerRun(
            key=key,
            name=name,
            pod_ns=self.netns,
            hostname=self.name,
            image=str(c.get("image", "")),
            argv=argv,
            image_entrypoint=image is None and not c.get("command"),
            env={k: v for k, v in env.items()},
            dir=self.dir / "containers" / f"{name}-{instance}",
            log=self.dir / "logs" / f"{name}-{instance}.log",
            mounts=mounts,
            etc_files=etc,
            image_files=image_files,
            user=user,
            group=group,
            groups=groups,
            caps=caps,
            no_new_privs=nnp,
            seccomp=model.seccomp(self.spec, c),
            readonly_root=readonly,
            devices=devices,
            workdir=c.get("workingDir"),
        )
        if self.k.settings.lab_charon and adapt.is_charon(c):
            self.k.adapt_charon(run)
        return run

    async def _before_charon(self) -> None:
        """The lab kernel's need: the plan's sourceAddress on lo (adapt.py)."""
        for vol in self.volumes.values():
            if vol.kind == "configMap" and vol.written and "plan.json" in vol.written:
                addr = adapt.source_address(vol.written["plan.json"][0])
                if addr:
                    cmd = ["ip", "-n", self.netns, "addr", "replace", f"{addr}/32", "dev", "lo"]
                    await anyio.to_thread.run_sync(netns.run, cmd)

    async def _supervise(self, c: Obj, init: bool) -> None:
        name = str(c["name"])
        crashes = 0
        instance = 0
        restart_policy = self.spec.get("restartPolicy", "Always")
        # The container's restart loop with CrashLoopBackOff (a daemon's main loop, not a wait;
        # allowed in tests/unit/test_no_polling_loops.py).
        while True:
            try:
                run = self._container_run(c, instance)
            except model.EnvError as exc:
                self._set(name, state="waiting", reason="CreateContainerConfigError", message=str(exc))
                await anyio.sleep(2)
                continue
            run.log.parent.mkdir(parents=True, exist_ok=True)
            if self.k.settings.lab_charon and adapt.is_charon(c):
                await self._before_charon()
            try:
                running = await self.k.runtime.start(run)
            except (OSError, netns.LabError) as exc:
                crashes += 1
                self._set(name, state="waiting", reason="CreateContainerError", message=str(exc)[:500])
                await anyio.sleep(
                    model.restart_delay(
                        crashes + 1, self.k.settings.backoff_initial, self.k.settings.backoff_max
                    )
                )
                continue
            t0 = time.monotonic()
            inst = Instance(running, t0)
            self.instances[name] = inst
            has_readiness = bool(c.get("readinessProbe"))
            self._set(
                name,
                state="running",
                reason="",
                message="",
                started_at=now(),
                finished_at=None,
                exit_code=None,
                container_id=running.container_id,
                started=not c.get("startupProbe"),
                ready=not init and not has_readiness and not c.get("startupProbe"),
            )
            log.info(
                "kubelet.container.started pod=%s/%s container=%s instance=%d runtime=%s",
                self.namespace,
                self.name,
                name,
                instance,
                self.k.runtime.name,
            )
            rc = await self._run_instance(c, inst, init)
            st = self.container_state(name)
            started_at = st.started_at if st else None
            reason = model.terminated_reason(rc)
            finished = now()
            message = f"killed by the kubelet: {inst.killed_by}" if inst.killed_by else ""
            self.instances.pop(name, None)
            terminated = {
                "exitCode": rc,
                "reason": reason,
                "startedAt": started_at,
                "finishedAt": finished,
                "containerID": running.container_id,
            }
            self._set(
                name,
                state="terminated",
                reason=reason,
                exit_code=rc,
                finished_at=finished,
                ready=False,
                started=False,
                message=message,
            )
            log.info(
                "kubelet.container.exited pod=%s/%s container=%s exit=%d ran_s=%.1f",
                self.namespace,
                self.name,
                name,
                rc,
                time.monotonic() - t0,
            )
            if init and rc == 0:
                return
            if restart_policy == "Never" or (restart_policy == "OnFailure" and rc == 0):
                if not init:
                    return
                return
            if time.monotonic() - t0 > self.k.settings.backoff_reset:
                crashes = 0
            crashes += 1
            delay = model.restart_delay(crashes, self.k.settings.backoff_initial, self.k.settings.backoff_max)
            if delay > 0:
                self._set(
                    name,
                    state="waiting",
                    reason="CrashLoopBackOff",
                    message=f"back-off {delay:g}s restarting failed container={name} "
                    f"pod={self.name}_{self.namespace}({self.uid})",
                    last=terminated,
                    restarts=(st.restarts if st else 0) + 1,
                )
                await anyio.sleep(delay)
            else:
                self._set(name, last=terminated, restarts=(st.restarts if st else 0) + 1)
            instance += 1

    async def _run_instance(self, c: Obj, inst: Instance, init: bool) -> int:
        async with anyio.create_task_group() as tg:
            if not init:
                if c.get("startupProbe"):
                    tg.start_soon(self._probe_loop, c, "startup", inst)
                else:
                    for kind in ("readiness", "liveness"):
                        if c.get(f"{kind}Probe"):
                            tg.start_soon(self._probe_loop, c, kind, inst)
            rc = await inst.running.wait()
            tg.cancel_scope.cancel()
        return rc

    async def _probe_loop(self, c: Obj, kind: str, inst: Instance) -> None:
        name = str(c["name"])
        probe: Obj = c[f"{kind}Probe"]
        await anyio.sleep(float(probe.get("initialDelaySeconds", 0)))
        state = model.ProbeState()
        period = float(probe.get("periodSeconds", 10)) * self.k.settings.probe_period_factor
        # The probe's period (a daemon's sampling loop, not a wait for a condition;
        # allowed in tests/unit/test_no_polling_loops.py).
        while True:
            ok, detail = await self._probe(c, probe)
            record = self.probes.setdefault((name, kind), ProbeRecord())
            record.successes += int(ok)
            record.failures += int(not ok)
            record.last = detail
            new = model.probe_step(state, ok, probe)
            if not ok and (state.failures == 0 or new.ok is False):
                log.info(
                    "kubelet.probe.failed pod=%s/%s container=%s probe=%s detail=%r",
                    self.namespace,
                    self.name,
                    name,
                    kind,
                    detail,
                )
            if kind == "readiness":
                st = self.container_state(name)
                ready = new.ok is True
                if st is not None and st.ready != ready:
                    self._set(name, ready=ready)
            elif kind == "liveness" and new.ok is False:
                inst.killed_by = f"liveness probe failed: {detail}"
                grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
                await inst.running.stop(grace)
                return
            elif kind == "startup" and new.ok is True:
                self._set(name, started=True, ready=not c.get("readinessProbe"))
                for k2 in ("readiness", "liveness"):
                    if c.get(f"{k2}Probe"):
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._probe_loop, c, k2, inst)
                return
            elif kind == "startup" and new.ok is False:
                inst.killed_by = f"startup probe failed: {detail}"
                await inst.running.stop(float(self.spec.get("terminationGracePeriodSeconds", 30)))
                return
            state = new
            await anyio.sleep(period)

    async def _probe(self, c: Obj, probe: Obj) -> tuple[bool, str]:
        timeout = float(probe.get("timeoutSeconds", 1))
        host = self.view.pod_ip
        if "httpGet" in probe:
            hg = probe["httpGet"]
            port = self._port(c, hg.get("port"))
            path = str(hg.get("path", "/"))
            target = str(hg.get("host") or host)

            def get() -> tuple[bool, str]:
                conn = http.client.HTTPConnection(target, port, timeout=timeout)
                try:
                    conn.request("GET", path, headers={"User-Agent": "kube-probe/lab"})
                    res = conn.getresponse()
                    res.read()
                    return 200 <= res.status < 400, f"HTTP {res.status}"
                except OSError as exc:
                    return False, f"{type(exc).__name__}: {exc}"
                finally:
                    conn.close()

            return await anyio.to_thread.run_sync(lambda: in_netns(self.k.node_network.ns, get))
        if "tcpSocket" in probe:
            port = self._port(c, probe["tcpSocket"].get("port"))

            def connect() -> tuple[bool, str]:
                try:
                    with socket.create_connection((host, port), timeout=timeout):
                        return True, "connected"
                except OSError as exc:
                    return False, str(exc)

            return await anyio.to_thread.run_sync(lambda: in_netns(self.k.node_network.ns, connect))
        return False, "probe type not supported by the lab kubelet (httpGet, tcpSocket)"

    def _port(self, c: Obj, port: Any) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"named port {port!r} not found")

    async def kill(self, container: str, sig: int = signal.SIGKILL) -> bool:
        inst = self.instances.get(container)
        if inst is None:
            return False
        await inst.running.kill(sig)
        return True

    # --- status ----------------------------------------------------------------------------------------

    async def _status_writer(self) -> None:
        # The status writer's loop (a daemon's main loop: the sleeps coalesce and back off;
        # allowed in tests/unit/test_no_polling_loops.py).
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            await anyio.sleep(0.05)  # coalesce a burst of changes into one write
            if self.k.partitioned:
                continue  # nothing reaches the API server; the next change after healing writes it all
            try:
                await self._write_status()
            except NotFound:
                return
            except KubeError as exc:
                log.warning("kubelet.status_failed pod=%s/%s error=%r", self.namespace, self.name, str(exc))
                self._dirty.set()
                await anyio.sleep(0.5)

    async def _write_status(self) -> None:
        """Patch the view on the status subresource when it changed since the last write (one writer at a
        time: the writer task while the pod runs, teardown after it ended), as a real kubelet's status
        manager does: the pod read fresh, the kubelet's status merged with it (the conditions it does not
        own kept), a strategic merge patch of the difference with the pod's uid as precondition.
        NotFound when the pod is gone (or its name is another pod's)."""
        status, transitions = model.pod_status(self.view, now())
        self.view = replace(self.view, transitions=transitions)
        if status == self._written:
            return
        pod = await self.k.kube.get(PODS, self.name, self.namespace)
        if pod["metadata"].get("uid") != self.uid:
            raise NotFound(404, "NotFound", f"pod {self.namespace}/{self.name} is another pod now")
        current: Obj = pod.get("status") or {}
        # The API server sets the QoS class at creation and refuses a change (a real one validates it
        # immutable): keep the one the pod has.
        mine = {**status, "qosClass": current.get("qosClass") or status["qosClass"]}
        patch = model.status_patch(current, model.merged_status(current, mine))
        if patch:
            await self.k.kube.request(
                "PATCH",
                PODS.path(self.namespace, self.name, "status"),
                params={"fieldManager": self.k.kube.field_manager or "lab-kubelet"},
                body={"metadata": {"uid": self.uid}, "status": patch},
                content_type=model.STRATEGIC_MERGE,
            )
        self._written = status

    async def _write_terminal(self) -> None:
        """A deleted pod's containers stopped: its terminal phase, before the deletion is confirmed (a real
        kubelet's status manager writes it, then deletes with grace 0; a pod deleted without ever
        reaching the API server as terminal stays Running to every watcher until it is gone)."""
        if self.view.phase not in ("Succeeded", "Failed"):
            self.view = replace(self.view, phase=model.terminal_phase(self.view))
        for _ in range(20):
            try:
                await self._write_status()
                return
            except (NotFound, Conflict):
                return  # gone already, or the name is another pod's now
            except KubeError as exc:
                log.warning("kubelet.status_failed pod=%s/%s error=%r", self.namespace, self.name, str(exc))
                await anyio.sleep(0.2)

    # --- teardown --------------------------------------------------------------------------------------

    async def _teardown(self) -> None:
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))

        async def stop(name: str, inst: Instance) -> None:
            await inst.running.stop(grace)
            rc = await inst.running.wait()
            self._set(
                name,
                state="terminated",
                reason=model.terminated_reason(rc),
                exit_code=rc,
                finished_at=now(),
                ready=False,
                started=False,
            )

        async with anyio.create_task_group() as tg:
            for name, inst in list(self.instances.items()):
                tg.start_soon(stop, name, inst)
        self.instances.clear()
        if self.k.runtime.name == "podman":
            await self.k.remove_pod_containers(self.netns)
        if self.capture is not None:
            self.flows = self.capture.snapshot()
            await anyio.to_thread.run_sync(self.capture.close)
            self.capture = None
        if self.sandbox.ip is not None or netns.pids_in(self.netns) or self.netns in netns.list_namespaces():
            self.errors += await anyio.to_thread.run_sync(self.sandbox.teardown)
        await anyio.to_thread.run_sync(volumes.remove_tree, self.dir / "volumes")
        if self.k.settings.keep_logs and self.k.settings.workdir is not None and (self.dir / "logs").exists():
            keep = self.k.settings.workdir / "kubelet-logs" / self.name
            await anyio.to_thread.run_sync(
                lambda: shutil.copytree(self.dir / "logs", keep, dirs_exist_ok=True)
            )
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        if self.deleting and not self.k.partitioned:
            await self._write_terminal()
            await self.confirm_deletion()
        log.info(
            "kubelet.pod.stopped pod=%s/%s deleting=%s errors=%d",
            self.namespace,
            self.name,
            self.deleting,
            len(self.errors),
        )

    async def confirm_deletion(self) -> None:
        """The containers are gone: tell the API server (``settings.deletion``)."""
        if self.k.settings.deletion == "api":
            await self._delete_now()
        else:
            await self._release_finalizer()

    async def _delete_now(self) -> None:
        """What the kubelet does on a real API server once a terminating pod's containers stopped: DELETE
        with gracePeriodSeconds 0 and the pod's uid as precondition (another pod of the same name is not
        this one), after which the object is gone."""
        for _ in range(20):
            try:
                await self.k.kube.delete(PODS, self.name, self.namespace, uid=self.uid, grace_seconds=0)
                log.info("kubelet.pod.deletion_confirmed pod=%s/%s", self.namespace, self.name)
                return
            except (NotFound, Conflict):
                return  # gone already, or the name is another pod's now
            except KubeError as exc:
                log.warning(
                    "kubelet.pod.delete_failed pod=%s/%s error=%r", self.namespace, self.name, str(exc)
                )
                await anyio.sleep(0.2)

    async def _release_finalizer(self) -> None:
        for _ in range(20):
            try:
                pod = await self.k.kube.get(PODS, self.name, self.namespace)
            except NotFound:
                return
            except KubeError:
                await anyio.sleep(0.2)
                continue
            fins = pod["metadata"].get("finalizers") or []
            if model.GRACEFUL_FINALIZER not in fins:
                return
            i = fins.index(model.GRACEFUL_FINALIZER)
            patch = [
                {"op": "test", "path": f"/metadata/finalizers/{i}", "value": model.GRACEFUL_FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{i}"},
            ]
            try:
                await self.k.kube.patch(PODS, self.name, patch, self.namespace, content_type=JSON_PATCH)
                return
            except NotFound:
                return
            except KubeError:
                await anyio.sleep(0.2)


def random_suffix(n: int = 5) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))
