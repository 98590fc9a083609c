"""The lab kubelet's decisions, pure: which pod a Deployment wants, what a ServiceAccount admission adds,
which sysctls a pod may set, what Multus attaches, what environment and files a container gets, how long
a restart waits, and what the pod's status says. Data in, data out; no I/O, no clock (times are
arguments).

Where these follow Kubernetes they say so; where the lab simplifies, the docstring says how
(docs/e2e.md lists the differences).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

Obj = dict[str, Any]

TEMPLATE_HASH_LABEL = "pod-template-hash"
GRACEFUL_FINALIZER = "lab.kubelet.vpn.bnerd.net/graceful-termination"
"""The emulator deletes a pod at once (it does not model graceful deletion); this finalizer, set when the
lab kubelet creates the pod and removed once its containers have stopped, gives deletion the real
sequence: ``deletionTimestamp`` while the containers stop (the pod shows Terminating), then gone."""
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
TOKEN_EXPIRATION = 3607
"""What the ServiceAccount admission plugin asks for (an hour plus seven seconds)."""

SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
"""The kubelet's safe set (k8s.io/kubernetes pkg/kubelet/sysctl/safe_sysctls.go); anything else must be
in ``--allowed-unsafe-sysctls``."""


# --- Deployment -> Pod ---------------------------------------------------------------------------------


def template_hash(template: Mapping[str, Any]) -> str:
    """A stable hash of a pod template (the Deployment controller's ``pod-template-hash`` label)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()[:10]


def service_account_volume(suffix: str, expiration: int = TOKEN_EXPIRATION) -> Obj:
    """The volume the ServiceAccount admission plugin adds (``kube-api-access-<suffix>``)."""
    return {
        "name": f"kube-api-access-{suffix}",
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": expiration, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ],
        },
    }


def admit_service_account(spec: Obj, suffix: str) -> Obj:
    """The pod spec after the ServiceAccount admission plugin: ``serviceAccountName`` defaulted, and
    (automountServiceAccountToken not false) the token volume mounted read-only in every container at
    /var/run/secrets/kubernetes.io/serviceaccount, unless the container mounts something there."""
    out: Obj = json.loads(json.dumps(spec))
    out.setdefault("serviceAccountName", "default")
    out["serviceAccount"] = out["serviceAccountName"]
    if out.get("automountServiceAccountToken") is False:
        return out
    vol = service_account_volume(suffix)
    out["volumes"] = [*(out.get("volumes") or []), vol]
    for key in ("initContainers", "containers"):
        for c in out.get(key) or []:
            mounts = c.setdefault("volumeMounts", [])
            if not any(m.get("mountPath") == SERVICE_ACCOUNT_DIR for m in mounts):
                mounts.append({"name": vol["name"], "readOnly": True, "mountPath": SERVICE_ACCOUNT_DIR})
    return out


def pod_for(deployment: Mapping[str, Any], suffix: str, sa_suffix: str) -> Obj:
    """The Pod a one-replica Deployment wants now (the Deployment controller's ReplicaSet step folded in:
    the pod is owned by the Deployment; named ``<deployment>-<template hash>-<suffix>``)."""
    md = deployment["metadata"]
    template = deployment["spec"]["template"]
    h = template_hash(template)
    tmd = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{md['name']}-{h}-{suffix}",
            "namespace": md["namespace"],
            "labels": {**(tmd.get("labels") or {}), TEMPLATE_HASH_LABEL: h},
            "annotations": dict(tmd.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": md["name"],
                    "uid": md["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": [GRACEFUL_FINALIZER],
        },
        "spec": admit_service_account(template.get("spec") or {}, sa_suffix),
    }


DeploymentStep = Literal["create", "delete-old", "wait", "none"]


def deployment_step(
    deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> tuple[DeploymentStep, list[str]]:
    """Strategy Recreate with at most one replica: ``("delete-old", names)`` while pods of another template
    exist, ``("wait", names)`` while they are still terminating, ``("create", [])`` when none of the
    current template exists, else ``("none", [])``. ``replicas: 0`` deletes everything."""
    want = int((deployment.get("spec") or {}).get("replicas", 1))
    h = template_hash(deployment["spec"]["template"])
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    terminating = [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
    old = [
        p["metadata"]["name"]
        for p in live
        if (p["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL) != h
    ]
    current = [p for p in live if (p["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL) == h]
    if want == 0:
        return ("delete-old", [p["metadata"]["name"] for p in live]) if live else ("none", [])
    if old:
        return "delete-old", old
    if len(current) > want:
        return "delete-old", sorted(p["metadata"]["name"] for p in current)[want:]
    if terminating and not current:
        return "wait", terminating
    if not current:
        return "create", []
    return "none", []


def deployment_status(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Obj:
    h = template_hash(deployment["spec"]["template"])
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    updated = [p for p in live if (p["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL) == h]
    ready = [p for p in live if pod_ready(p)]
    want = int((deployment.get("spec") or {}).get("replicas", 1))
    available = len(ready) >= want
    return {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "replicas": len(live),
        "updatedReplicas": len(updated),
        "readyReplicas": len(ready),
        "availableReplicas": len(ready),
        "unavailableReplicas": max(0, want - len(ready)),
        "conditions": [
            {
                "type": "Available",
                "status": "True" if available else "False",
                "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            }
        ],
    }


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


# --- admission on the node ------------------------------------------------------------------------------


def forbidden_sysctls(spec: Mapping[str, Any], allowed_unsafe: Sequence[str]) -> list[str]:
    """The pod's ``securityContext.sysctls`` the kubelet refuses (neither safe nor allowed)."""
    names = [str(s.get("name")) for s in (spec.get("securityContext") or {}).get("sysctls") or []]
    allowed = set(allowed_unsafe)
    out = []
    for n in names:
        if n in SAFE_SYSCTLS or n in allowed:
            continue
        if any(a.endswith("*") and n.startswith(a[:-1]) for a in allowed):
            continue
        out.append(n)
    return out


def pod_sysctls(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (str(s["name"]), str(s["value"])) for s in (spec.get("securityContext") or {}).get("sysctls") or []
    ]


# --- Multus ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    """One additional network of a pod, as Multus reads it from the annotation and the NAD."""

    namespace: str
    name: str
    interface: str
    mac: str | None = None
    device: str | None = None


def network_selections(annotation: str | None, pod_namespace: str) -> list[tuple[str, str, str]]:
    """(namespace, NAD name, interface) per element of ``k8s.v1.cni.cncf.io/networks`` (JSON list or the
    comma-separated short form); interfaces default to net1, net2, ... as Multus names them."""
    if not annotation or not annotation.strip():
        return []
    text = annotation.strip()
    items: list[Mapping[str, Any]]
    if text.startswith("["):
        parsed = json.loads(text)
        if not isinstance(parsed, list):
            raise ValueError(f"{NETWORKS_ANNOTATION}: not a list")
        items = [dict(i) for i in parsed]
    else:
        items = []
        for part in text.split(","):
            ns, _, rest = part.strip().rpartition("/")
            name, _, iface = rest.partition("@")
            items.append(
                {"namespace": ns or pod_namespace, "name": name, **({"interface": iface} if iface else {})}
            )
    out = []
    for i, item in enumerate(items, start=1):
        out.append(
            (
                str(item.get("namespace") or pod_namespace),
                str(item["name"]),
                str(item.get("interface") or f"net{i}"),
            )
        )
    return out


def host_device(config: str) -> tuple[str | None, str | None]:
    """(hwaddr, device) of a host-device CNI configuration; ValueError for another plugin or neither."""
    doc = json.loads(config)
    plugins = doc.get("plugins") or [doc]
    first = plugins[0]
    if first.get("type") != "host-device":
        raise ValueError(f"CNI plugin {first.get('type')!r}: the lab attaches host-device only")
    mac, dev = first.get("hwaddr"), first.get("device")
    if not mac and not dev:
        raise ValueError("host-device: neither hwaddr nor device")
    return (str(mac).lower() if mac else None, str(dev) if dev else None)


def network_status(pod_ip: str, attachments: Sequence[Attachment]) -> str:
    """``k8s.v1.cni.cncf.io/network-status`` as Multus writes it."""
    doc: list[Obj] = [
        {"name": "lab-pod-network", "interface": "eth0", "ips": [pod_ip], "default": True, "dns": {}}
    ]
    for a in attachments:
        entry: Obj = {"name": f"{a.namespace}/{a.name}", "interface": a.interface, "dns": {}}
        if a.mac:
            entry["mac"] = a.mac
        doc.append(entry)
    return json.dumps(doc, indent=4)


# --- the environment --------------------------------------------------------------------------------------

_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined references replaced, ``$$`` -> ``$``, others kept."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(sub, text)


def service_env(host: str, port: int) -> dict[str, str]:
    """The ``kubernetes`` service's variables: injected whatever ``enableServiceLinks`` says."""
    url = f"tcp://{host}:{port}"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": url,
        f"KUBERNETES_PORT_{port}_TCP": url,
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }


class EnvError(ValueError):
    """A reference that cannot be resolved (CreateContainerConfigError)."""


def field_value(pod: Mapping[str, Any], path: str) -> str:
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    st = pod.get("status") or {}
    simple = {
        "metadata.name": md.get("name"),
        "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": st.get("podIP"),
        "status.hostIP": st.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((md.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = md.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise EnvError(f"fieldRef {path!r}: not supported")


Lookup = Mapping[tuple[str, str], Mapping[str, str] | None]
"""(kind "configmap"/"secret", name) -> its data as text (Secrets decoded), or None: it does not exist."""


def _key_ref(ref: Mapping[str, Any], kind: str, lookup: Lookup) -> str | None:
    data = lookup.get((kind, str(ref.get("name"))))
    key = str(ref.get("key"))
    if data is None or key not in data:
        if ref.get("optional"):
            return None
        what = "configmap" if kind == "configmap" else "secret"
        raise EnvError(f"{what} {ref.get('name')!r} (key {key!r}) not found")
    return data[key]


def container_env(
    container: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup, base: Mapping[str, str]
) -> dict[str, str]:
    """``base`` (image and runtime variables), then the kubernetes service's, then ``envFrom``, then
    ``env`` in order with ``$(VAR)`` expansion against what came before, as the kubelet builds it."""
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = str(src.get("prefix") or "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = src.get(key)
            if ref is None:
                continue
            data = lookup.get((kind, str(ref.get("name"))))
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"{kind} {ref.get('name')!r} not found")
            env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = str(var["name"])
        if "value" in var:
            env[name] = expand(str(var["value"]), env)
            continue
        vf = var.get("valueFrom") or {}
        value: str | None
        if "fieldRef" in vf:
            value = field_value(pod, str(vf["fieldRef"]["fieldPath"]))
        elif "configMapKeyRef" in vf:
            value = _key_ref(vf["configMapKeyRef"], "configmap", lookup)
        elif "secretKeyRef" in vf:
            value = _key_ref(vf["secretKeyRef"], "secret", lookup)
        elif "resourceFieldRef" in vf:
            value = _resource_field(container, vf["resourceFieldRef"])
        else:
            value = ""
        if value is not None:
            env[name] = value
    return env


def _resource_field(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    what, _, res = str(ref.get("resource", "")).partition(".")
    value = ((container.get("resources") or {}).get(what) or {}).get(res)
    return str(value) if value is not None else "0"


def command_line(
    container: Mapping[str, Any],
    env: Mapping[str, str],
    image_entrypoint: Sequence[str] = (),
    image_cmd: Sequence[str] = (),
) -> list[str]:
    """``command`` replaces the image's ENTRYPOINT, ``args`` its CMD (a command alone drops the CMD)."""
    command = [expand(str(a), env) for a in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    if command:
        return command + args
    return list(image_entrypoint) + (args or list(image_cmd))


def describe(argv: Sequence[str]) -> str:
    return shlex.join(argv)


# --- files ------------------------------------------------------------------------------------------------

Files = dict[str, tuple[bytes, int]]
"""Relative path -> (content, mode) of one volume's payload."""


def _items(data: Mapping[str, bytes], items: Sequence[Mapping[str, Any]] | None, default_mode: int) -> Files:
    if not items:
        return {k: (v, default_mode) for k, v in data.items()}
    out: Files = {}
    for it in items:
        key = str(it["key"])
        if key in data:
            out[str(it["path"])] = (data[key], int(it.get("mode", default_mode)))
    return out


def configmap_files(cm: Mapping[str, Any], source: Mapping[str, Any], default_mode: int = 0o644) -> Files:
    data = {k: str(v).encode() for k, v in (cm.get("data") or {}).items()}
    data.update({k: base64.b64decode(str(v)) for k, v in (cm.get("binaryData") or {}).items()})
    return _items(data, source.get("items"), int(source.get("defaultMode", default_mode)))


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(str(v)) for k, v in (secret.get("data") or {}).items()}


def secret_files(secret: Mapping[str, Any], source: Mapping[str, Any], default_mode: int = 0o644) -> Files:
    return _items(secret_data(secret), source.get("items"), int(source.get("defaultMode", default_mode)))


def downward_files(pod: Mapping[str, Any], source: Mapping[str, Any], default_mode: int = 0o644) -> Files:
    mode = int(source.get("defaultMode", default_mode))
    out: Files = {}
    for it in source.get("items") or []:
        if "fieldRef" in it:
            value = field_value(pod, str(it["fieldRef"]["fieldPath"]))
            out[str(it["path"])] = (value.encode(), int(it.get("mode", mode)))
    return out


def resolv_conf(namespace: str, dns_ip: str, domain: str) -> str:
    """ClusterFirst: the cluster DNS, the namespace's search path, ndots 5 (what the kubelet writes)."""
    return f"search {namespace}.svc.{domain} svc.{domain} {domain}\nnameserver {dns_ip}\noptions ndots:5\n"


def hosts_file(pod_ip: str, hostname: str) -> str:
    return (
        "# Kubernetes-managed hosts file (the lab kubelet).\n127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{pod_ip}\t{hostname}\n"
    )


# --- restarts and probes ----------------------------------------------------------------------------------


def restart_delay(crashes: int, initial: float = 10.0, cap: float = 300.0) -> float:
    """Seconds before restarting a container that exited for the ``crashes``-th time in a row: at once the
    first time, then ``initial`` doubling up to ``cap`` (the kubelet's CrashLoopBackOff)."""
    if crashes <= 1:
        return 0.0
    return float(min(cap, initial * 2 ** (crashes - 2)))


@dataclass(frozen=True)
class ProbeState:
    """One probe's counters and verdict (``ok`` None: undecided yet)."""

    ok: bool | None = None
    successes: int = 0
    failures: int = 0


def probe_step(state: ProbeState, success: bool, probe: Mapping[str, Any]) -> ProbeState:
    """The kubelet's thresholds: ``successThreshold`` (1) successes in a row make it pass,
    ``failureThreshold`` (3) failures in a row make it fail."""
    if success:
        n = state.successes + 1
        ok = True if n >= int(probe.get("successThreshold", 1)) else state.ok
        return ProbeState(ok, n, 0)
    n = state.failures + 1
    ok = False if n >= int(probe.get("failureThreshold", 3)) else state.ok
    return ProbeState(ok, 0, n)


# --- status ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerState:
    """What the kubelet knows of one container (an instance may have come and gone: ``restarts``)."""

    name: str
    image: str
    state: Literal["waiting", "running", "terminated"] = "waiting"
    reason: str = "PodInitializing"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    container_id: str = ""
    restarts: int = 0
    ready: bool = False
    started: bool = False
    last: Obj | None = None
    """``lastState.terminated`` of the previous instance."""


def container_status(c: ContainerState, image_id: str = "") -> Obj:
    state: Obj
    if c.state == "running":
        state = {"running": {"startedAt": c.started_at}}
    elif c.state == "terminated":
        state = {
            "terminated": {
                "exitCode": c.exit_code if c.exit_code is not None else 0,
                "reason": c.reason,
                "startedAt": c.started_at,
                "finishedAt": c.finished_at,
                **({"containerID": c.container_id} if c.container_id else {}),
                **({"message": c.message} if c.message else {}),
            }
        }
    else:
        state = {"waiting": {"reason": c.reason, **({"message": c.message} if c.message else {})}}
    out: Obj = {
        "name": c.name,
        "image": c.image,
        "imageID": image_id,
        "ready": c.ready,
        "started": c.started,
        "restartCount": c.restarts,
        "state": state,
        "lastState": {"terminated": c.last} if c.last else {},
    }
    if c.container_id:
        out["containerID"] = c.container_id
    return out


def terminated_reason(exit_code: int, oom: bool = False) -> str:
    if oom:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


@dataclass(frozen=True)
class PodView:
    """The kubelet's view of one pod, turned into ``status`` by ``pod_status``."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed"] = "Pending"
    reason: str = ""
    message: str = ""
    pod_ip: str = ""
    host_ip: str = ""
    start_time: str = ""
    sandbox_ready: bool = False
    init: tuple[ContainerState, ...] = ()
    containers: tuple[ContainerState, ...] = ()
    transitions: Mapping[str, str] = field(default_factory=dict)
    """Condition type -> lastTransitionTime, kept while the condition holds."""


def conditions(view: PodView) -> dict[str, bool]:
    initialized = all(c.state == "terminated" and c.exit_code == 0 for c in view.init)
    ready_containers = bool(view.containers) and all(c.ready for c in view.containers)
    return {
        "PodReadyToStartContainers": view.sandbox_ready,
        "Initialized": initialized,
        "ContainersReady": ready_containers and initialized,
        "Ready": ready_containers and initialized and view.phase == "Running",
        "PodScheduled": True,
    }


def pod_status(view: PodView, now: str) -> tuple[Obj, dict[str, str]]:
    """The status document, and the transition times to keep for next time."""
    conds = conditions(view)
    transitions = dict(view.transitions)
    out_conds = []
    for kind, ok in conds.items():
        key = f"{kind}={ok}"
        at = transitions.get(key) or now
        transitions = {k: v for k, v in transitions.items() if not k.startswith(f"{kind}=")}
        transitions[key] = at
        cond: Obj = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": at}
        if not ok and kind in ("Ready", "ContainersReady"):
            not_ready = [c.name for c in view.containers if not c.ready]
            if not_ready:
                cond["reason"] = "ContainersNotReady"
                cond["message"] = f"containers with unready status: [{' '.join(not_ready)}]"
        if not ok and kind == "Initialized":
            pending = [c.name for c in view.init if not (c.state == "terminated" and c.exit_code == 0)]
            cond["reason"] = "ContainersNotInitialized"
            cond["message"] = f"containers with incomplete status: [{' '.join(pending)}]"
        out_conds.append(cond)
    status: Obj = {"phase": view.phase, "conditions": out_conds}
    if view.reason:
        status["reason"] = view.reason
    if view.message:
        status["message"] = view.message
    if view.host_ip:
        status["hostIP"] = view.host_ip
        status["hostIPs"] = [{"ip": view.host_ip}]
    if view.pod_ip:
        status["podIP"] = view.pod_ip
        status["podIPs"] = [{"ip": view.pod_ip}]
    if view.start_time:
        status["startTime"] = view.start_time
    if view.init:
        status["initContainerStatuses"] = [container_status(c) for c in view.init]
    if view.containers:
        status["containerStatuses"] = [container_status(c) for c in view.containers]
    status["qosClass"] = "Burstable"
    return status, transitions


KUBELET_CONDITIONS = frozenset(
    {
        "PodScheduled",
        "Ready",
        "Initialized",
        "ContainersReady",
        "PodReadyToStartContainers",
        "PodResizeInProgress",
        "PodResizePending",
    }
)
"""The pod conditions a kubelet owns (pkg/kubelet/types/pod_status.go PodConditionsByKubelet, with the
PodReadyToStartContainers gate on): it writes these and keeps every other one (DisruptionTarget of the
taint eviction controller or pod GC, a readiness gate's condition)."""

STRATEGIC_MERGE: Final = "application/strategic-merge-patch+json"

KUBELET_FIELDS = frozenset(
    {
        "phase",
        "reason",
        "message",
        "hostIP",
        "hostIPs",
        "podIP",
        "podIPs",
        "startTime",
        "initContainerStatuses",
        "containerStatuses",
        "ephemeralContainerStatuses",
    }
)
"""The fields of a pod's status the kubelet writes whole: one it no longer has is removed. Others
(``conditions`` merge by type, ``qosClass``, ``resourceClaimStatuses``, ``nominatedNodeName``) are not."""

STATUS_MERGE_KEYS: Mapping[str, str] = {"conditions": "type"}
"""The pod status' lists a strategic merge patch merges by key (k8s.io/api core/v1 PodStatus: also
``hostIPs`` and ``podIPs`` by ``ip``, which the kubelet sets once, so a whole list is the same patch)."""

ATOMIC_STATUSES = frozenset({"initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"})
"""Lists a strategic merge patch replaces whole on the real server (no patchStrategy in PodStatus), which
the emulator's strategic merge (lab.kubeapi.patch MERGE_KEYS) merges by ``name``: written whole, with a
null for each field an element no longer has, the same on both."""


def merged_status(current: Obj, mine: Obj) -> Obj:
    """``mine`` (``pod_status``'s) with the conditions of ``current`` (the status on the API server) that
    the kubelet does not own kept, before its own: pkg/kubelet/status/status_manager.go mergePodStatus
    (DisruptionTarget of the taint eviction controller or pod GC, a readiness gate's condition)."""
    foreign = [c for c in current.get("conditions") or [] if c.get("type") not in KUBELET_CONDITIONS]
    return {**mine, "conditions": [*foreign, *(mine.get("conditions") or [])]}


def status_patch(current: Obj, new: Obj) -> Obj:
    """The strategic merge patch from ``current`` to ``new`` (``merged_status``'s), as a real kubelet's
    PatchPodStatus makes it (a two-way merge patch, pkg/util/pod): only what changed; a field the kubelet
    owns and no longer has is null (removed); lists merge by their key, an element changed is patched
    field by field, an element gone is ``$patch: delete``; the container statuses are written whole
    when one changed (``ATOMIC_STATUSES``: a container's ``state.running`` is null beside the new
    ``state.terminated``); the other lists are replaced whole. Empty when nothing changed."""
    out = _diff(current, new)
    for k in current.keys() - new.keys():
        if k in KUBELET_FIELDS:
            out[k] = None
    return out


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    out: Obj = {}
    for k, v in new.items():
        o = old.get(k)
        if o == v:
            continue
        if isinstance(v, Mapping) and isinstance(o, Mapping):
            d = _diff(o, v)
            d.update(_gone(o, v))
            if d:
                out[k] = d
        elif isinstance(v, list) and isinstance(o, list) and k in STATUS_MERGE_KEYS:
            changed = _list_diff(o, v, STATUS_MERGE_KEYS[k])
            if changed:  # the same elements in another order: nothing to write
                out[k] = changed
        elif isinstance(v, list) and isinstance(o, list) and k in ATOMIC_STATUSES:
            before = {x.get("name"): x for x in o if isinstance(x, Mapping)}
            out[k] = [_with_nulls(before.get(x.get("name")), x) for x in v]
        else:
            out[k] = v
    return out


def _with_nulls(old: Any, new: Any) -> Any:
    """``new`` whole, with a null for every key of ``old`` (at any depth of maps) it no longer has."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return new
    out = {k: _with_nulls(old.get(k), v) for k, v in new.items()}
    out.update(_gone(old, new))
    return out


def _gone(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """A null for each key ``old`` has a value for and ``new`` does not."""
    return {k: None for k in old.keys() - new.keys() if old[k] is not None}


def _list_diff(old: list[Any], new: list[Any], key: str) -> list[Any]:
    before = {o.get(key): o for o in old if isinstance(o, Mapping)}
    out: list[Any] = []
    for n in new:
        o = before.get(n.get(key))
        if o is None:
            out.append(n)
        elif o != n:
            d = _diff(o, n)
            d.update(_gone(o, n))
            if d:
                out.append({key: n[key], **d})
    names = {n.get(key) for n in new}
    out += [{"$patch": "delete", key: k} for k in before if k not in names]
    return out


def terminal_phase(view: PodView) -> Literal["Succeeded", "Failed"]:
    """The phase a kubelet writes once a deleted pod's containers stopped (pkg/kubelet/kubelet_pods.go
    getPhase with podIsTerminal): Succeeded when every container exited 0, else Failed (one exited
    otherwise or never ran)."""
    ok = bool(view.containers) and all(c.state == "terminated" and c.exit_code == 0 for c in view.containers)
    return "Succeeded" if ok else "Failed"


def with_state(c: ContainerState, **kw: Any) -> ContainerState:
    return replace(c, **kw)


# --- images (process mode) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageConfig:
    """What a container runtime takes from an image's configuration: the final stage of its Dockerfile."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    user: str = ""


def _exec_form(rest: str) -> tuple[str, ...]:
    """ENTRYPOINT/CMD: the JSON exec form as given, the shell form as ``/bin/sh -c`` runs it."""
    text = rest.strip()
    if text.startswith("["):
        parsed = json.loads(text)
        if not isinstance(parsed, list):
            raise ValueError(f"not an exec form: {text!r}")
        return tuple(str(a) for a in parsed)
    return ("/bin/sh", "-c", text) if text else ()


def _expand_env(value: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def image_config(dockerfile: str) -> ImageConfig:
    """``ENTRYPOINT``, ``CMD``, ``ENV`` (``$VAR``/``${VAR}`` of earlier ENV lines expanded) and ``USER``
    of a Dockerfile's last stage, as the built image's configuration carries them. A CMD before a later
    ENTRYPOINT is dropped, as the builder does."""
    lines: list[str] = []
    pending = ""
    for raw in dockerfile.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = {}
    user = ""
    for line in lines:
        word, _, rest = line.partition(" ")
        op = word.upper()
        if op == "FROM":
            entrypoint, cmd, env, user = (), (), {}, ""
        elif op == "ENTRYPOINT":
            entrypoint, cmd = _exec_form(rest), ()
        elif op == "CMD":
            cmd = _exec_form(rest)
        elif op == "USER":
            user = rest.strip()
        elif op == "ENV":
            parts = shlex.split(rest)
            pairs = (
                [tuple(p.split("=", 1)) for p in parts]
                if parts and "=" in parts[0]
                else [(parts[0], " ".join(parts[1:]))]
            )
            for k, v in pairs:
                env[k] = _expand_env(v, env)
    return ImageConfig(entrypoint, cmd, env, user)


# --- scheduling (the scheduler the emulated cluster lacks) -----------------------------------------------


def tolerates(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """The API's toleration matching: ``Exists`` (an empty key: every taint) or ``Equal`` (the default:
    key and value), and the effect (empty: every effect)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and str(t.get("value", "")) == str(taint.get("value", "")):
            return True
    return False


def _expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = str(expr["key"]), str(expr["operator"]), [str(v) for v in expr.get("values") or []]
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and have is not None and have.lstrip("-").isdigit() and values:
        return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
    return False


def _node_ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def unfit(spec: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """Why the scheduler would not bind a pod with this spec to ``node`` ("" when it fits): the node is
    Ready and schedulable, its labels match ``nodeSelector`` and the required node affinity, and the pod
    tolerates its NoSchedule and NoExecute taints (the scheduler's filters that a one-node lab needs;
    resources, ports and inter-pod affinity are not filtered)."""
    nspec = node.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not _node_ready(node):
        return "node(s) were not ready"
    if nspec.get("unschedulable"):
        return "node(s) were unschedulable"
    selector = spec.get("nodeSelector") or {}
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if any(labels.get(k) != v for k, v in selector.items()) or (
        required
        and not any(
            all(_expression(e, labels) for e in term.get("matchExpressions") or []) for term in required
        )
    ):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in nspec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
            taint, spec.get("tolerations") or []
        ):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    return ""


def schedule(spec: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """(the node to bind a pod with this spec to, the first by name that fits; or None and the
    scheduler's ``Unschedulable`` message: ``0/N nodes are available: ...``)."""
    reasons: dict[str, int] = {}
    for node in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name"))):
        why = unfit(spec, node)
        if not why:
            return str(node["metadata"]["name"]), ""
        reasons[why] = reasons.get(why, 0) + 1
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail or 'no nodes registered'}."


def seccomp(
    spec: Mapping[str, Any], container: Mapping[str, Any]
) -> Literal["runtime-default", "unconfined"]:
    """The seccomp profile the kubelet asks the runtime for: the container's ``seccompProfile``, else the
    pod's; ``RuntimeDefault`` is the runtime's default filter, ``Unconfined`` and no profile at all are
    none (the kubelet's default without ``--seccomp-default``); a privileged container is unconfined.
    ``Localhost`` profiles are not supported by the lab kubelet (EnvError)."""
    sc = container.get("securityContext") or {}
    if sc.get("privileged"):
        return "unconfined"
    profile = sc.get("seccompProfile") or (spec.get("securityContext") or {}).get("seccompProfile") or {}
    kind = profile.get("type", "Unconfined")
    if kind == "RuntimeDefault":
        return "runtime-default"
    if kind == "Unconfined":
        return "unconfined"
    raise EnvError(f"seccompProfile {kind}: not supported by the lab kubelet (RuntimeDefault, Unconfined)")
