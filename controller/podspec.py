"""The gateway pod, as a Deployment spec. Pure.

One replica, ``Recreate`` (two pods would fight over one Neutron port), hard-pinned with ``nodeName`` to the
node whose Nova instance carries the port (no scheduler: the port is attached there). Multus moves NIC2
in by the NAD (host-device by MAC). An HA gateway (docs/ha.md) has one such Deployment per slot, each with
its own node, NIC2, NAD and ConfigMap; slot a's is exactly a gateway's without HA. Containers and what
each may do (images/gateway/Dockerfile states the same):

* ``init-nat`` (init container, then a ``--watch`` sidecar): root, NET_ADMIN + NET_RAW (iptables-legacy
  reads need NET_RAW). It needs a forwarding namespace: the pod's ``securityContext.sysctls`` set
  ``net.ipv4.ip_forward=1`` and ``net.ipv4.conf.all.rp_filter=2`` (settings ``sysctls: pod``), or the
  init container runs privileged (``privileged-init``), or the node's runtime already does (``none``).
* ``charon`` (IPsec): root, NET_ADMIN NET_RAW NET_BIND_SERVICE SETGID CHOWN (IKE's ports; group vpngw
  for the VICI socket).
* ``wireguard-go`` (WireGuard, settings ``wireguard: wireguard-go``): root, NET_ADMIN, /dev/net/tun.
* ``status-agent``: IPsec: 65532:65532 with no capabilities (the VICI socket is group vpngw); WireGuard:
  root with NET_ADMIN (it creates and configures the device). It follows the plan ConfigMap and the
  plan's Secrets through the API and writes them to ``/run/vpngw`` (a memory emptyDir) for the others;
  the mounted ConfigMap is the fallback at boot. Liveness ``/healthz``, readiness ``/readyz``. Its env
  ``POD_NAMESPACE`` and ``POD_NAME`` (the downward API): an HA gateway's agent holds the Lease as its pod
  name. Every pod has ``POD_NAME``, HA or not, so enabling HA never changes slot a's template.
* ``exporter``: 65532:65532 with no capabilities in both modes, and only ``/run/vpngw-readonly``
  mounted (read-only): the status-agent serves there a copy of the plan and a socket that can only read
  the daemon (``--readonly-dir``): a VICI relay passing queries only (charon has no read-only socket),
  or a UAPI socket answering ``get=1`` without keys (wireguard-go's socket is 0700 root, the kernel's
  netlink GET needs NET_ADMIN). Not charon's control socket, not the live directory (the Secrets).
  Liveness ``/healthz`` on the metrics port.

Every container: all capabilities dropped but those, no privilege escalation, read-only root file system
(writable emptyDirs where a program writes), the RuntimeDefault seccomp profile. Only the status-agent
has an API token: the pod mounts none (``automountServiceAccountToken: false``) and the agent's container
alone mounts a projected one (token, the cluster's CA, the namespace), where the in-cluster config looks.

The pod runs in the operator's gateway namespace (``Settings.gateway_namespace``), never the tenant's.
"""

from __future__ import annotations

import json
from typing import Any

import gwplan
from controller.names import (
    ANNOTATION_NIC_MAC,
    LABEL_HA_SLOT,
    MULTUS_NETWORKS,
    GatewayKey,
    HaSlot,
    labels,
    selector_labels,
)
from controller.settings import Settings

Obj = dict[str, Any]

PLAN_DIR = "/etc/vpngw/plan"
"""The plan ConfigMap's volume (kubelet refreshes it 60-90 s after a change: the fallback at boot)."""
LIVE_DIR = "/run/vpngw"
"""The status-agent's copy of the plan and its Secrets, current within ~1 s of an API change."""
LIVE_PLAN = f"{LIVE_DIR}/plan.json"
INITNAT_STATUS = f"{LIVE_DIR}/initnat-status.json"
"""What init-nat left out and why; the status-agent publishes it as ``status.initNat``."""
VICI_DIR = "/run/charon"
VICI_SOCKET = f"{VICI_DIR}/charon.vici"
WIREGUARD_DIR = "/var/run/wireguard"
READONLY_DIR = "/run/vpngw-readonly"
"""The exporter's only volume: the agent's ``--readonly-dir`` (plan.json, charon.vici or <if>.sock)."""
NOT_READY_TOLERATION_SECONDS = 30
IPSEC_CAPS = ["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE", "SETGID", "CHOWN"]
INITNAT_CAPS = ["NET_ADMIN", "NET_RAW"]
UNPRIVILEGED = 65532
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 (a path)
TOKEN_SECONDS = 3607
"""As the ServiceAccount admission plugin's own volume: an hour and seven seconds (kubelet refreshes it)."""


def _security(
    *, user: int, caps: list[str] | None = None, privileged: bool = False, read_only: bool = True
) -> Obj:
    if privileged:
        return {"privileged": True, "runAsUser": user, "readOnlyRootFilesystem": read_only}
    sc: Obj = {
        "runAsUser": user,
        "runAsGroup": user,
        "runAsNonRoot": user != 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only,
        "capabilities": {"drop": ["ALL"]},
    }
    if caps:
        sc["capabilities"]["add"] = list(caps)
    return sc


def _mount(name: str, path: str, *, read_only: bool = False) -> Obj:
    m: Obj = {"name": name, "mountPath": path}
    if read_only:
        m["readOnly"] = True
    return m


def _field_env(name: str, path: str) -> Obj:
    """An env var from the downward API (the pod's own metadata)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(path: str, port: int, *, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _container(
    name: str, settings: Settings, command: list[str], *, role: str | None = None, **extra: Any
) -> Obj:
    """``role``: the settings' resources key when it is not the container's name."""
    c: Obj = {
        "name": name,
        "image": settings.pod.image,
        "imagePullPolicy": settings.pod.image_pull_policy,
        "command": command,
    }
    res = settings.pod.resources.get(role or name)
    if res is not None and res.to_api():
        c["resources"] = res.to_api()
    c.update(extra)
    return c


def _log_flags(settings: Settings) -> list[str]:
    """The programs' ``--log-format``: only when not their default (text), so a text installation's pod
    template, and with it every running gateway pod, stays as it was."""
    return [] if settings.pod.log_format == "text" else ["--log-format", settings.pod.log_format]


def containers(
    key: GatewayKey, plan: gwplan.Plan, settings: Settings, slot: HaSlot = "a"
) -> tuple[list[Obj], list[Obj]]:
    """(init containers, containers) of ``slot``'s pod (its agent follows its slot's ConfigMap)."""
    pod = settings.pod
    logs = _log_flags(settings)
    initnat = ["python3", "-m", "initnat", *logs]
    privileged_init = pod.sysctls == "privileged-init"
    nat_mounts = [_mount("plan", PLAN_DIR, read_only=True), _mount("run", "/run"), _mount("live", LIVE_DIR)]
    init = [
        _container(
            "init-nat",
            settings,
            [*initnat, "--plan", f"{PLAN_DIR}/plan.json", "--status-file", INITNAT_STATUS],
            securityContext=_security(user=0, caps=INITNAT_CAPS, privileged=privileged_init),
            volumeMounts=nat_mounts,
        )
    ]
    wireguard = plan.type == "wireguard"
    agent_user = 0 if wireguard else UNPRIVILEGED
    agent_caps = ["NET_ADMIN"] if wireguard else None
    daemon_mounts = [_mount("vici", VICI_DIR)] if not wireguard else [_mount("wireguard", WIREGUARD_DIR)]
    agent_cmd = [
        "python3", "-m", "agent", *logs,
        "--plan", LIVE_PLAN,
        "--plan-fallback", f"{PLAN_DIR}/plan.json",
        "--follow-configmap", key.slot_name(slot),
        "--live-dir", LIVE_DIR,
        "--secrets-dir", f"{LIVE_DIR}/secrets",
        "--kube-status",
        "--initnat-status", INITNAT_STATUS,
        "--health-listen", f"0.0.0.0:{pod.health_port}",
        "--readonly-dir", READONLY_DIR,
    ]  # fmt: skip
    if wireguard:
        agent_cmd += ["--wireguard-uapi-dir", WIREGUARD_DIR]
    else:
        agent_cmd += ["--vici-socket", VICI_SOCKET]
    exporter_cmd = [
        "python3",
        "-m",
        "exporter",
        *logs,
        "--listen",
        f"0.0.0.0:{pod.metrics_port}",
        "--plan",
        f"{READONLY_DIR}/plan.json",
    ]
    exporter_cmd += (
        ["--wireguard-interface", settings.wireguard_interface, "--wireguard-uapi-dir", READONLY_DIR]
        if wireguard
        else ["--vici-socket", f"{READONLY_DIR}/charon.vici"]
    )
    main: list[Obj] = [
        _container(
            "init-nat-watch",  # a pod's container names are unique across init and main containers
            settings,
            [*initnat, "--plan", LIVE_PLAN, "--watch", "--status-file", INITNAT_STATUS],
            role="init-nat",
            securityContext=_security(user=0, caps=INITNAT_CAPS),
            volumeMounts=nat_mounts,
        )
    ]
    if not wireguard:
        main.append(
            _container(
                "charon",
                settings,
                ["/usr/lib/ipsec/charon"],
                securityContext=_security(user=0, caps=IPSEC_CAPS),
                volumeMounts=[_mount("charon-run", "/run"), _mount("vici", VICI_DIR)],
            )
        )
    elif pod.wireguard == "wireguard-go":
        main.append(
            _container(
                "wireguard-go",
                settings,
                ["wireguard-go", "-f", settings.wireguard_interface],
                env=[{"name": "WG_PROCESS_FOREGROUND", "value": "1"}],
                securityContext=_security(user=0, caps=["NET_ADMIN"]),
                volumeMounts=[_mount("wireguard", WIREGUARD_DIR), _mount("tun", "/dev/net/tun")],
            )
        )
    main.append(
        _container(
            "status-agent",
            settings,
            agent_cmd,
            securityContext=_security(user=agent_user, caps=agent_caps),
            volumeMounts=[
                _mount("plan", PLAN_DIR, read_only=True),
                _mount("live", LIVE_DIR),
                _mount("tmp", "/tmp"),
                _mount("api-token", TOKEN_DIR, read_only=True),
                *daemon_mounts,
                _mount("readonly", READONLY_DIR),
            ],
            env=[_field_env("POD_NAMESPACE", "metadata.namespace"), _field_env("POD_NAME", "metadata.name")],
            ports=[{"name": "health", "containerPort": pod.health_port, "protocol": "TCP"}],
            livenessProbe=_probe("/healthz", pod.health_port, period=10, failures=3),
            readinessProbe=_probe("/readyz", pod.health_port, period=5, failures=2),
        )
    )
    main.append(
        _container(
            "exporter",
            settings,
            exporter_cmd,
            securityContext=_security(user=UNPRIVILEGED),
            volumeMounts=[_mount("readonly", READONLY_DIR, read_only=True)],
            ports=[{"name": "metrics", "containerPort": pod.metrics_port, "protocol": "TCP"}],
            livenessProbe=_probe("/healthz", pod.metrics_port, period=10, failures=3),
        )
    )
    return init, main


def volumes(key: GatewayKey, plan: gwplan.Plan, settings: Settings, slot: HaSlot = "a") -> list[Obj]:
    vols: list[Obj] = [
        {"name": "plan", "configMap": {"name": key.slot_name(slot)}},
        token_volume(),
        {"name": "live", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "readonly", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
    ]
    if plan.type == "ipsec":
        vols += [
            {"name": "vici", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "charon-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ]
    else:
        vols.append({"name": "wireguard", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
        if settings.pod.wireguard == "wireguard-go":
            vols.append({"name": "tun", "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}})
    return vols


def token_volume() -> Obj:
    """The status-agent's API credentials: what the ServiceAccount admission plugin would mount in every
    container, mounted in that one only."""
    return {
        "name": "api-token",
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ],
        },
    }


def tolerations(settings: Settings) -> list[Obj]:
    base = [
        {
            "key": f"node.kubernetes.io/{what}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": NOT_READY_TOLERATION_SECONDS,
        }
        for what in ("not-ready", "unreachable")
    ]
    return base + [dict(t) for t in settings.pod.tolerations]


def pod_spec(key: GatewayKey, plan: gwplan.Plan, settings: Settings, node: str, slot: HaSlot = "a") -> Obj:
    init, main = containers(key, plan, settings, slot)
    pod = settings.pod
    security: Obj = {"seccompProfile": {"type": "RuntimeDefault"}}
    if pod.sysctls == "pod":
        security["sysctls"] = [
            {"name": "net.ipv4.ip_forward", "value": "1"},
            {"name": "net.ipv4.conf.all.rp_filter", "value": "2"},
        ]
    spec: Obj = {
        "nodeName": node,
        "serviceAccountName": key.home_name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": pod.termination_grace_seconds,
        "securityContext": security,
        "tolerations": tolerations(settings),
        "initContainers": init,
        "containers": main,
        "volumes": volumes(key, plan, settings, slot),
    }
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.priority_class_name:
        spec["priorityClassName"] = pod.priority_class_name
    if pod.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in pod.image_pull_secrets]
    return spec


def slot_labels(slot: HaSlot) -> dict[str, str]:
    """What an HA slot adds to its pods' labels and its Deployment's selector: nothing for slot a (its
    Deployment is a gateway's without HA: its selector is immutable and its template unchanged)."""
    return {} if slot == "a" else {LABEL_HA_SLOT: slot}


def deployment_spec(
    key: GatewayKey, plan: gwplan.Plan, settings: Settings, mac: str, node: str, slot: HaSlot = "a"
) -> Obj:
    """``slot``'s Deployment: slot b's pod attaches its own NAD, mounts its own ConfigMap and carries
    ``LABEL_HA_SLOT``, which its selector requires too. Slot a's selector also matches slot b's pods;
    the ReplicaSet and Deployment controllers count only the pods and ReplicaSets whose controllerRef is
    theirs, and adopt only orphans, so neither takes the other's."""
    networks = json.dumps(
        [{"name": key.slot_name(slot), "namespace": settings.gateway_namespace}], separators=(",", ":")
    )
    return {
        "replicas": 1,
        "strategy": {"type": "Recreate"},
        "revisionHistoryLimit": 2,
        "selector": {"matchLabels": {**selector_labels(key), **slot_labels(slot)}},
        "template": {
            "metadata": {
                "labels": {**labels(key, settings.instance), **slot_labels(slot)},
                "annotations": {MULTUS_NETWORKS: networks, ANNOTATION_NIC_MAC: mac},
            },
            "spec": pod_spec(key, plan, settings, node, slot),
        },
    }
