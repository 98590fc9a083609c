"""Why a gateway is not Ready: problems, each with its cause and its fix, most important first. Pure.

``python -m controller diagnose NAMESPACE/NAME`` (``controller.diagnosecli``) reads what the cluster (and,
given credentials, the cloud) holds about one gateway into a ``Snapshot``; ``diagnose`` turns it into
``Finding``\\ s. The knowledge lives here and is keyed on what the system itself writes, never on guessed
strings:

* the controller's conditions and reasons (``controller.status``, ``controller.reconcile``,
  ``controller.cloud``, ``controller.openstack``: ``ConfigRendered`` ``PartlyRendered`` with the parts
  left out, ``SecretNotOptedIn``; ``PodReady`` ``NoSchedulableNode``, ``FailedCreate`` (the Deployment's
  ``ReplicaFailure``), ``PodNotReady`` with the kubelet's ``SysctlForbidden``; ``CloudReady``
  ``FloatingIPFailed`` with Neutron's quota message; ``OwnedObjects`` ``NotFound`` for a
  NetworkAttachmentDefinition the API does not serve);
* the status-agent's keys (``status.agent.connected`` / ``lastError`` "charon unreachable: ...",
  ``status.tunnels[].lastError`` "AUTHENTICATION_FAILED: ..." from ``agent.ipsec.status``,
  ``status.peers[].state`` ``Failed``) and its ``/readyz`` body ("not ready: <reason>"), read on the
  pod's IP or through the API server's pod proxy (the output says which; neither: a note);
* the objects themselves (the pod's phase, reason and container states, the Deployment's conditions, the
  nodes, the referenced Secrets' names and labels, Events).

Each check says which conditions it explains (``covers``); a False condition no check explains is still
reported, with its own reason and message, so nothing the controller says is dropped. Secrets: the
snapshot holds their names and labels only (the reader asks for metadata), so no value can be printed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from controller.names import LABEL_GATEWAY_SECRET, LABEL_TENANT, TENANT_ENABLED, GatewayKey
from controller.status import ADVISORY

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
Obj = Mapping[str, Any]
SecretState = Literal["ok", "missing", "not-opted-in"]


@dataclass(frozen=True)
class Finding:
    """One problem: what is wrong, why, and what to do. ``code`` is stable (scripts may match on it)."""

    severity: Severity
    code: str
    what: str
    cause: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


READYZ_DIRECT = "the pod's IP"
READYZ_PROXY = "the API server's pod proxy"


@dataclass(frozen=True)
class Readyz:
    """The status-agent's ``/readyz`` answer: ``code`` None when it could not be reached (``body`` why,
    for each way tried)."""

    code: int | None
    body: str
    via: str = READYZ_DIRECT
    """The way that answered: ``READYZ_DIRECT`` (the pod's IP, from where diagnose runs) or
    ``READYZ_PROXY`` (``GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/readyz``, as ``kubectl get --raw``)."""


def agents_answer(code: int, body: str) -> bool:
    """Whether an answer on the readyz address is the status-agent's (agent/health.py: 200 ``ready: ...``
    or 503 ``not ready: ...``), not another host's or a proxy's on the same address."""
    return (code == 200 and body.startswith("ready: ")) or (code == 503 and body.startswith("not ready: "))


@dataclass(frozen=True)
class Snapshot:
    """What the reader found about one gateway; None (or absent) where it could not look."""

    key: GatewayKey
    gateway: Obj | None
    """The CR; None: it does not exist (``unreadable`` says when it could not be read at all)."""
    gateway_namespace: str = "vpngw-gateways"
    namespace: Obj | None = None
    """The gateway's (tenant's) Namespace."""
    peers: tuple[Obj, ...] = ()
    events: tuple[Obj, ...] = ()
    """Events about the gateway and its peers (its namespace) and about the objects the reader found for
    it in the gateway namespace (Deployment, ReplicaSets, pods, ...): matched by the involved object's uid,
    never by its name (a tenant names its objects as it likes)."""
    owned: Mapping[str, Obj] = field(default_factory=dict)
    """Kind -> the gateway's object of that kind in the gateway namespace (ConfigMap, Deployment, ...)."""
    pods: tuple[Obj, ...] = ()
    nodes: tuple[Obj, ...] | None = None
    nad_served: bool | None = None
    """Whether the API serves NetworkAttachmentDefinitions (Multus' CRD); None: not known."""
    secrets: Mapping[str, SecretState] | None = None
    """Each Secret the gateway and its peers reference -> what the namespace holds; None: not read."""
    readyz: Readyz | None = None
    cloud: Obj | None = None
    """What the cloud holds (``OpenStackCloud.inspect``); None: not asked."""
    unreadable: Mapping[str, str] = field(default_factory=dict)
    """What could not be read -> why (an API error, a Forbidden)."""


# --- helpers ---------------------------------------------------------------------------------------------


def conditions(obj: Obj | None) -> dict[str, Obj]:
    return {
        str(c.get("type")): c
        for c in ((obj or {}).get("status") or {}).get("conditions") or []
        if isinstance(c, Mapping)
    }


def _false(c: Obj | None) -> bool:
    return c is not None and c.get("status") == "False"


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def secret_refs(docs: Iterable[Obj]) -> dict[str, str]:
    """Secret name -> where it is referenced first (``Kind/name spec.path``), of every ``...SecretRef``."""
    out: dict[str, str] = {}

    def walk(node: Any, where: str, path: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k.endswith("SecretRef") and isinstance(v, Mapping) and isinstance(v.get("name"), str):
                    out.setdefault(v["name"], f"{where} {path}.{k}")
                else:
                    walk(v, where, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, where, f"{path}[{i}]")

    for d in docs:
        walk(d.get("spec"), f"{d.get('kind')}/{_name(d)}", "spec")
    return out


def secret_state(meta: Obj | None) -> SecretState:
    """A Secret's state from its metadata alone."""
    if meta is None:
        return "missing"
    labels = (meta.get("metadata") or {}).get("labels") or {}
    return "ok" if labels.get(LABEL_GATEWAY_SECRET) == "true" else "not-opted-in"


def _node_ready(n: Obj) -> bool:
    for c in (n.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _newest_pod(pods: Sequence[Obj]) -> Obj | None:
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return None
    return max(live, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))


def _container_states(pod: Obj) -> list[tuple[str, str, str, str]]:
    """(container, state, reason, message) of each container not running and ready."""
    st = pod.get("status") or {}
    out = []
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        if not isinstance(cs, Mapping):
            continue
        state = cs.get("state") or {}
        for which in ("waiting", "terminated"):
            s = state.get(which)
            if isinstance(s, Mapping) and not (which == "terminated" and s.get("exitCode") == 0):
                out.append(
                    (str(cs.get("name")), which, str(s.get("reason") or ""), str(s.get("message") or ""))
                )
        last = (cs.get("lastState") or {}).get("terminated")
        if "running" in state and isinstance(last, Mapping) and not cs.get("ready"):
            out.append(
                (
                    str(cs.get("name")),
                    "restarted",
                    str(last.get("reason") or ""),
                    str(last.get("message") or ""),
                )
            )
    return out


# --- the checks --------------------------------------------------------------------------------------------


@dataclass
class _Found:
    findings: list[tuple[int, Finding]] = field(default_factory=list)
    covered: set[str] = field(default_factory=set)

    @property
    def codes(self) -> set[str]:
        return {f.code for _, f in self.findings}

    def add(self, rank: int, finding: Finding, *covers: str) -> None:
        self.findings.append((rank, finding))
        self.covered.update(covers)


Check = Callable[[Snapshot, dict[str, Obj], _Found], None]

# Ranks: a lower rank comes first within a severity. Causes upstream of others come first (no CRD, no
# node, no pod before anything inside the pod).
R_GATEWAY, R_CLUSTER, R_CONFIG, R_POD, R_CLOUD, R_AGENT, R_TUNNEL, R_OTHER = range(0, 800, 100)


def _check_gateway(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    key = snap.key
    if "gateway" in snap.unreadable:
        out.add(
            R_GATEWAY,
            Finding(
                "error",
                "GatewayUnreadable",
                f"{key} could not be read",
                snap.unreadable["gateway"],
                "check the kubeconfig and context (--kubeconfig, --context), that the API server is "
                f"reachable, and that you may get {key.plural} in namespace {key.namespace}",
            ),
        )
        return
    if snap.gateway is None:
        out.add(
            R_GATEWAY,
            Finding(
                "error",
                "GatewayNotFound",
                f"{key} does not exist",
                f"no {key.kind} {key.name} in namespace {key.namespace}",
                f"check the name (kubectl get {key.plural} -n {key.namespace}); a legacy gateway is "
                "IPsecGateway/NAMESPACE/NAME",
            ),
        )
        return
    ns_labels = ((snap.namespace or {}).get("metadata") or {}).get("labels") or {}
    if snap.namespace is not None and ns_labels.get(LABEL_TENANT) != TENANT_ENABLED:
        out.add(
            R_GATEWAY + 10,
            Finding(
                "error",
                "NamespaceNotEnabled",
                f"namespace {key.namespace} is not enabled for gateways",
                f"it lacks the label {LABEL_TENANT}={TENANT_ENABLED}: the controller renders nothing there",
                f"kubectl label namespace {key.namespace} {LABEL_TENANT}={TENANT_ENABLED} "
                "(whoever administers "
                "namespaces; also the chart's tenants.namespaces for the controller's Secret rights)",
            ),
            "ConfigRendered",
        )
    if not conds:
        out.add(
            R_GATEWAY + 20,
            Finding(
                "error",
                "NoStatus",
                f"{key} has no conditions: no controller has reconciled it",
                "the controller is not running, is not leading, or does not watch this namespace "
                "(--namespace) or this kind",
                "kubectl -n vpngw-system get pods,lease; "
                "kubectl -n vpngw-system logs deploy/vpngw-controller",
            ),
        )
        return
    md = snap.gateway.get("metadata") or {}
    seen = (snap.gateway.get("status") or {}).get("observedGeneration")
    if isinstance(seen, int) and isinstance(md.get("generation"), int) and seen < md["generation"]:
        out.add(
            R_OTHER,
            Finding(
                "warning",
                "StatusStale",
                f"the status describes generation {seen}, the spec is generation {md['generation']}",
                "the controller has not reconciled the latest change yet (busy, backing off, or not running)",
                "wait a few seconds and run this again; if it stays, read the controller's log",
            ),
        )


def _check_multus(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    owned = conds.get("OwnedObjects") or {}
    refusals = str(owned.get("message") or "").split("; ")
    nad = [r for r in refusals if "NetworkAttachmentDefinition" in r and ": NotFound: " in r]
    if snap.nad_served is False or (_false(owned) and nad):
        out.add(
            R_CLUSTER,
            Finding(
                "error",
                "NoMultusCRD",
                "the API server does not serve NetworkAttachmentDefinitions (k8s.cni.cncf.io/v1)",
                "Multus is not installed: its CustomResourceDefinition is missing, so the gateway's NAD "
                "cannot be created and NIC2 cannot be attached to the pod"
                + (f" ({nad[0][:300]})" if nad else ""),
                "install Multus and the CNI reference plugins (host-device) in the cluster "
                "(docs/install.md, 'Before installing'); the controller retries by itself",
            ),
            # Only when it is all OwnedObjects says: another refusal is reported on its own.
            *(["OwnedObjects"] if nad and len(nad) == len(refusals) else []),
        )


PODSECURITY = re.compile(r"violates PodSecurity \"([^\"]+)\"")


def _replica_failures(snap: Snapshot, conds: dict[str, Obj]) -> list[str]:
    msgs = []
    pod_ready = conds.get("PodReady")
    if _false(pod_ready) and pod_ready.get("reason") == "FailedCreate":  # type: ignore[union-attr]
        msgs.append(str(pod_ready.get("message")))  # type: ignore[union-attr]
    for c in conditions(snap.owned.get("Deployment")).values():
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            msgs.append(str(c.get("message")))
    for e in snap.events:
        if e.get("reason") == "FailedCreate":
            msgs.append(str(e.get("message")))
    return msgs


def _check_pod_creation(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    msgs = _replica_failures(snap, conds)
    if not msgs:
        return
    ps = next((m for m in msgs if PODSECURITY.search(m)), None)
    ns = snap.gateway_namespace
    if ps is not None:
        level = PODSECURITY.search(ps).group(1)  # type: ignore[union-attr]
        out.add(
            R_CLUSTER + 10,
            Finding(
                "error",
                "PodSecurityForbidden",
                f"the gateway pod cannot be created: Pod Security admission refuses it in namespace {ns}",
                f'namespace {ns} enforces PodSecurity "{level}", and a gateway pod needs NET_ADMIN, '
                "NET_RAW and "
                f"(with --gateway-sysctls pod) unsafe sysctls: {ps.split(': ', 1)[-1][:400]}",
                f"kubectl label --overwrite namespace {ns} pod-security.kubernetes.io/enforce=privileged "
                "(the chart makes the gateway namespace so; never a tenant's namespace)",
            ),
            "PodReady",
        )
        return
    out.add(
        R_CLUSTER + 20,
        Finding(
            "error",
            "PodCreateFailed",
            "the gateway pod cannot be created (the ReplicaSet controller's FailedCreate)",
            msgs[0][:600],
            f"fix what the API refuses (a ResourceQuota or LimitRange in {ns}, an admission webhook, a "
            "missing ServiceAccount); kubectl -n " + ns + " describe replicaset",
        ),
        "PodReady",
    )


def _check_nodes(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    pod_ready = conds.get("PodReady")
    said = _false(pod_ready) and pod_ready.get("reason") == "NoSchedulableNode"  # type: ignore[union-attr]
    none_ready = snap.nodes is not None and not any(_node_ready(n) for n in snap.nodes)
    if not (said or none_ready):
        return
    if snap.nodes is not None:
        ready = sorted(_name(n) for n in snap.nodes if _node_ready(n))
        cause = (
            f"{len(snap.nodes)} node(s), none Ready"
            if not ready
            else f"Ready nodes ({', '.join(ready[:10])}) are excluded by the node selector, taints, or the "
            "per-node cap"
        )
    else:
        cause = "no Ready node matches"
    detail = str(pod_ready.get("message")) if said else ""  # type: ignore[union-attr]
    out.add(
        R_CLUSTER + 30,
        Finding(
            "error",
            "NoReadyNode",
            "no Ready node can take the gateway",
            cause + (f" ({detail})" if detail else ""),
            "bring a node Ready (kubectl get nodes; kubectl describe node N), or widen the controller's "
            "--node-selector / gatewayPod.tolerations / --max-gateways-per-node",
        ),
        "PodReady",
    )


def _check_sysctls(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    pod = _newest_pod(snap.pods)
    pod_ready = conds.get("PodReady")
    msg = ""
    if pod is not None and (pod.get("status") or {}).get("reason") == "SysctlForbidden":
        msg = str((pod.get("status") or {}).get("message") or "")
    elif _false(pod_ready) and "SysctlForbidden" in str(pod_ready.get("message")):  # type: ignore[union-attr]
        msg = str(pod_ready.get("message"))  # type: ignore[union-attr]
    else:
        return
    node = ((pod or {}).get("spec") or {}).get("nodeName") or "the node"
    out.add(
        R_POD,
        Finding(
            "error",
            "SysctlForbidden",
            f"the kubelet on {node} rejected the gateway pod: SysctlForbidden",
            "the pod sets unsafe sysctls (net.ipv4.ip_forward, net.ipv4.conf.all.rp_filter) the kubelet "
            f"does "
            f"not allow: {msg[:400]}",
            "start the kubelets that run gateways with --allowed-unsafe-sysctls="
            "net.ipv4.ip_forward,net.ipv4.conf.all.rp_filter (KubeletConfiguration allowedUnsafeSysctls), "
            "or run the controller with --gateway-sysctls privileged-init (docs/install.md)",
        ),
        "PodReady",
    )


NOT_OPTED_IN = "which does not exist or is not opted in for gateways"
"""``controller.api.validate.not_opted_in``'s words (the problem's reason, SecretNotOptedIn, is not in the
condition's message)."""


def _check_secrets(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    cr = conds.get("ConfigRendered")
    said = _false(cr) and NOT_OPTED_IN in str(cr.get("message"))  # type: ignore[union-attr]
    refs = secret_refs([d for d in (snap.gateway, *snap.peers) if d is not None])
    bad = {n: s for n, s in (snap.secrets or {}).items() if s != "ok"}
    if not bad and said:
        for name in re.findall(r"names Secret ([-.a-z0-9]+), which does not exist", str(cr.get("message"))):  # type: ignore[union-attr]
            bad.setdefault(name, "missing")
    ns = snap.key.namespace
    for name, state in sorted(bad.items()):
        where = refs.get(name, "the gateway or a peer")
        if state == "missing":
            out.add(
                R_CONFIG,
                Finding(
                    "error",
                    "SecretMissing",
                    f"Secret {ns}/{name} does not exist",
                    f"{where} references it: what it keys is left out of the plan (a peer), or nothing "
                    "renders "
                    "(the gateway's own key)",
                    f"create it with the key the reference names and label it for gateways: kubectl -n {ns} "
                    f"create secret generic {name} --from-literal=KEY=...; "
                    f"kubectl -n {ns} label secret {name} "
                    f"{LABEL_GATEWAY_SECRET}=true",
                ),
                *(["ConfigRendered"] if said else []),
            )
        else:
            out.add(
                R_CONFIG,
                Finding(
                    "error",
                    "SecretNotOptedIn",
                    f"Secret {ns}/{name} is not opted in for gateways",
                    f"{where} references it, but it lacks the label {LABEL_GATEWAY_SECRET}=true: a gateway "
                    "is never given a Secret its owner did not mean for one",
                    f"kubectl -n {ns} label secret {name} {LABEL_GATEWAY_SECRET}=true "
                    "(if it is meant for the "
                    "gateway)",
                ),
                *(["ConfigRendered"] if said else []),
            )


LEFT_OUT = re.compile(r"left out \(([^)]*)\): (.*)$", re.S)


def _check_config(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    cr = conds.get("ConfigRendered")
    if not _false(cr) or "ConfigRendered" in out.covered:
        return
    assert cr is not None
    reason, message = str(cr.get("reason")), str(cr.get("message"))
    if reason == "PartlyRendered":
        m = LEFT_OUT.search(message)
        parts = [p.strip() for p in m.group(1).split(",")] if m else []
        problems = [p.strip() for p in (m.group(2) if m else message).split("; ")]
        for part in parts or ["a part"]:
            name = part.split(" ", 1)[-1]
            why = [p for p in problems if f"/{name}:" in p or f"/{name} " in p or name in p] or problems
            secret_said = {"SecretMissing", "SecretNotOptedIn"} & out.codes
            if secret_said and all(NOT_OPTED_IN in w for w in why):
                continue  # said with the Secret it names
            out.add(
                R_CONFIG + 10,
                Finding(
                    "error" if part.startswith("peer") else "warning",
                    "InvalidPeer" if part.startswith("peer") else "PartLeftOut",
                    f"{part} is left out of the gateway's plan (ConfigRendered=False, PartlyRendered)",
                    "; ".join(why)[:600],
                    "fix the field the cause names (kubectl edit, or kubectl apply of the corrected YAML; "
                    "python -m controller render -f FILE checks it offline); the rest of the plan runs",
                ),
                "ConfigRendered",
            )
        return
    out.add(
        R_CONFIG + 20,
        Finding(
            "error",
            reason,
            f"the gateway does not render (ConfigRendered=False, {reason})",
            message[:600],
            "fix what the message names (python -m controller render -f FILE shows every problem offline); "
            "the deployed plan, if any, keeps running meanwhile",
        ),
        "ConfigRendered",
    )


QUOTA = re.compile(r"quota", re.I)


def _check_cloud(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    c = conds.get("CloudReady")
    cloud = snap.cloud or {}
    if _false(c):
        assert c is not None
        reason, message = str(c.get("reason")), str(c.get("message"))
        if reason == "NotRendered":
            out.covered.add("CloudReady")  # a consequence: the cause is ConfigRendered's
            return
        if QUOTA.search(message):
            what = {
                "FloatingIPFailed": "floating IP",
                "PortFailed": "port",
                "SecurityGroupFailed": "security group",
            }
            out.add(
                R_CLOUD,
                Finding(
                    "error",
                    "FloatingIPQuota" if reason == "FloatingIPFailed" else "CloudQuota",
                    f"the cloud refused the gateway's {what.get(reason, reason)}: "
                    "the project's quota is used up",
                    message[:600],
                    "release unused floating IPs (openstack floating ip list --status DOWN) or ask for a "
                    "larger quota (openstack quota show); the controller retries by itself",
                ),
                "CloudReady",
            )
            return
        fixes = {
            "NoStaticNIC": "add the gateway to the controller's staticNICs (--config; the chart's "
            "cloud.static.nics)",
            "NoProviderID": "the node needs spec.providerID openstack:///<server-id> (the OpenStack cloud "
            "controller manager sets it)",
        }
        out.add(
            R_CLOUD + 10,
            Finding(
                "error",
                reason,
                f"the cloud step failed (CloudReady=False, {reason})",
                message[:600],
                fixes.get(
                    reason,
                    "read the message: Neutron's or Nova's answer; with --os-cloud this command shows what "
                    "the cloud holds; the controller retries with backoff",
                ),
            ),
            "CloudReady",
        )
    if snap.cloud is None:
        return
    port = cloud.get("port")
    if port is None and not _false(c):
        out.add(
            R_CLOUD + 20,
            Finding(
                "error",
                "NoPort",
                "the cloud holds no port tagged for this gateway",
                "the controller has not made it yet, or it was deleted by hand",
                "let the controller reconcile (kubectl annotate to nudge it) and read CloudReady",
            ),
        )
    elif port is not None and not cloud.get("floating_ips"):
        out.add(
            R_CLOUD + 30,
            Finding(
                "error",
                "NoFloatingIP",
                f"port {port.get('id')} has no floating IP tagged for this gateway",
                "the FloatingIP step has not run or failed",
                "read CloudReady's message; check the external network's free floating IPs and the quota",
            ),
        )
    if port is not None and not port.get("device_id"):
        out.add(
            R_CLOUD + 40,
            Finding(
                "warning",
                "PortNotAttached",
                f"port {port.get('id')} is not attached to a server",
                "the Attach step has not run or failed (the node's providerID, Nova)",
                "read CloudReady's message (AttachFailed, NoProviderID)",
            ),
        )
    if cloud.get("security_group") is None and port is not None:
        out.add(
            R_CLOUD + 50,
            Finding(
                "warning",
                "NoSecurityGroup",
                "no security group tagged for this gateway",
                "IKE/ESP or the WireGuard port may be closed to the peers",
                "read CloudReady's message (SecurityGroupFailed)",
            ),
        )


CHARON_DOWN = re.compile(r"charon unreachable|charon.*(?:not running|refused|No such file)", re.I)


def _check_agent(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    status = (snap.gateway or {}).get("status") or {}
    agent = status.get("agent") or {}
    error = str(agent.get("lastError") or "")
    ready_body = snap.readyz.body if snap.readyz and snap.readyz.code not in (None, 200) else ""
    pod = _newest_pod(snap.pods)
    charon = [s for s in (_container_states(pod) if pod else []) if s[0] == "charon"]
    down = (
        agent.get("connected") is False or CHARON_DOWN.search(error) is not None
        or CHARON_DOWN.search(ready_body) is not None or bool(charon)
    )  # fmt: skip
    if down and (status.get("tunnels") is not None or charon or "charon" in error + ready_body):
        why = [
            *([f"status.agent.lastError: {error}"] if error else []),
            *([f"status-agent /readyz: {ready_body.strip()}"] if ready_body else []),
            *(f"container charon {state}: {reason} {msg}".strip() for _, state, reason, msg in charon),
        ]
        out.add(
            R_AGENT,
            Finding(
                "error",
                "CharonDown",
                "charon (the IKE daemon) is not reachable by the status-agent",
                "; ".join(why)[:600] or "status.agent.connected is false",
                f"kubectl -n {snap.gateway_namespace} logs POD -c charon (and --previous): a crash, a config "
                "charon refuses, or a missing capability; the agent reconnects and re-pushes once it answers",
            ),
            "PodReady",
        )
    elif snap.readyz is not None and snap.readyz.code not in (None, 200):
        out.add(
            R_AGENT + 5,
            Finding(
                "error",
                "AgentNotReady",
                "the status-agent is not ready (its /readyz)",
                snap.readyz.body.strip()[:600],
                f"kubectl -n {snap.gateway_namespace} logs POD -c status-agent (health.not_ready says why)",
            ),
            "PodReady",
        )
    if snap.readyz is not None and snap.readyz.code is None:
        out.add(
            R_AGENT + 30,
            Finding(
                "info",
                "ReadyzUnreachable",
                "the status-agent's /readyz could not be read (its detail is missing here, not a problem)",
                snap.readyz.body.strip()[:600],
                "run diagnose where the pod's IP is reachable, or with the right to "
                f"`get pods/proxy` in namespace {snap.gateway_namespace} (the API server's pod proxy; "
                f"kubectl auth can-i get pods/proxy -n {snap.gateway_namespace})",
            ),
        )
    secret_errors = [p for p in error.split("; ") if p.startswith("secret ")]
    for p in secret_errors:
        out.add(
            R_AGENT + 10,
            Finding(
                "error",
                "SecretUnreadableInPod",
                f"the status-agent cannot use a Secret: {p}",
                "the Secret or its key is missing or empty, or not yet followed into the pod",
                f"check the Secret in namespace {snap.key.namespace} (its key and the label "
                f"{LABEL_GATEWAY_SECRET}=true)",
            ),
        )
    for peer in status.get("peers") or []:
        if isinstance(peer, Mapping) and peer.get("state") == "Failed":
            out.add(
                R_AGENT + 20,
                Finding(
                    "error",
                    "PeerFailed",
                    f"WireGuard peer {peer.get('name')} is left off the device",
                    str(peer.get("lastError") or "its key material is missing or unusable"),
                    "fix the peer's presharedKeySecretRef (the Secret, its key, its label)",
                ),
            )


def _check_tunnels(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    for t in ((snap.gateway or {}).get("status") or {}).get("tunnels") or []:
        if not isinstance(t, Mapping):
            continue
        err, name = str(t.get("lastError") or ""), t.get("name")
        if "AUTHENTICATION_FAILED" in err:
            theirs = "rejected our authentication" in err
            out.add(
                R_TUNNEL,
                Finding(
                    "error",
                    "PSKMismatch",
                    f"tunnel {name}: IKE authentication failed (PSK mismatch?)",
                    err[:600],
                    "the pre-shared key (the peer's pskSecretRef, else the gateway's) must equal the one the "
                    "remote site uses, and both sides' IDs must match ("
                    + ("the remote refused ours" if theirs else "the remote's did not verify here")
                    + "); a rotated Secret is reloaded live",
                ),
            )
        elif t.get("state") in ("Failed", "Down") and err:
            out.add(
                R_TUNNEL + 10,
                Finding(
                    "warning",
                    "TunnelDown",
                    f"tunnel {name} is {t.get('state')}",
                    err[:600],
                    "the cause names the side to fix (proposals, traffic selectors, the remote's address)",
                ),
            )


SANDBOX = ("FailedCreatePodSandBox", "FailedCreatePodSandbox")


def _about(e: Obj, obj: Obj) -> bool:
    """Whether Event ``e`` is about ``obj``: by uid, else (an object read without one) its kind and name."""
    md, inv = obj.get("metadata") or {}, e.get("involvedObject") or {}
    if md.get("uid"):
        return bool(inv.get("uid") == md["uid"])
    return bool(inv.get("kind") == obj.get("kind", inv.get("kind")) and inv.get("name") == md.get("name"))


def _warnings(snap: Snapshot, about: Obj | None = None) -> list[Obj]:
    """The Warning Events (about ``about``), newest last."""
    return [e for e in snap.events if e.get("type") == "Warning" and (about is None or _about(e, about))]


def _check_sandbox(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    """NIC2 not attached: the pod's sandbox fails when Multus cannot apply the NAD (host-device finds no
    interface with the MAC on the node: the port is not attached there, or another pod holds it)."""
    pod = _newest_pod(snap.pods)
    if pod is None or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
        return
    sandbox = [e for e in _warnings(snap, pod) if e.get("reason") in SANDBOX]
    if not sandbox:
        return
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    out.add(
        R_POD + 5,
        Finding(
            "error",
            "PodSandboxFailed",
            f"the gateway pod's network cannot be set up on {node} (FailedCreatePodSandBox)",
            str(sandbox[-1].get("message") or "")[:600],
            "when the message names Multus or host-device: NIC2 (the MAC in the NAD) must be on that node "
            "(OpenStack: the port attached to its server, see CloudReady; static: the NIC there) and held "
            "by no other pod; kubectl describe pod shows every attempt",
        ),
        "PodReady",
    )


def _check_pod(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    c = conds.get("PodReady")
    if not _false(c) or "PodReady" in out.covered:
        return
    assert c is not None
    reason, message = str(c.get("reason")), str(c.get("message"))
    pod = _newest_pod(snap.pods)
    states = _container_states(pod) if pod else []
    detail = "; ".join(f"{n} {s}: {r} {m}".strip() for n, s, r, m in states)
    if pod is not None:
        said = [f"{e.get('reason')}: {e.get('message')}" for e in _warnings(snap, pod)[-3:]]
        detail += ("; " if detail else "") + "; ".join(f"Event {w}" for w in said)
    fixes = {
        "NoPod": f"kubectl -n {snap.gateway_namespace} describe deployment (its ReplicaSet's Events)",
        "NoNIC2": "see CloudReady: the cloud has not provided NIC2 yet",
        "NotRendered": "see ConfigRendered",
    }
    consequence = {"NoNIC2": "CloudReady", "NotRendered": "ConfigRendered"}.get(reason)
    if consequence is not None and consequence in out.covered:
        return  # its cause is reported
    out.add(
        R_POD + 10,
        Finding(
            "error",
            reason,
            f"the gateway pod is not ready (PodReady=False, {reason})",
            (message + (f"; {detail}" if detail else ""))[:600],
            fixes.get(
                reason,
                f"kubectl -n {snap.gateway_namespace} describe pod, "
                "and logs -c init-nat / charon / status-agent",
            ),
        ),
        "PodReady",
    )


def _check_rest(snap: Snapshot, conds: dict[str, Obj], out: _Found) -> None:
    """Every False condition no check explained, as the controller says it."""
    for t, c in conds.items():
        if t == "Ready" or t in out.covered or not _false(c):
            continue
        out.add(
            R_OTHER + 10,
            Finding(
                "warning" if t in ADVISORY else "error",
                str(c.get("reason")),
                f"{t}=False ({c.get('reason')})",
                str(c.get("message"))[:600],
                "docs/controller.md, 'Status', lists what each reason means",
            ),
            t,
        )
    ready = conds.get("Ready")
    if _false(ready) and not out.findings:
        assert ready is not None
        out.add(
            R_OTHER + 20,
            Finding(
                "error",
                str(ready.get("reason")),
                "Ready=False",
                str(ready.get("message"))[:600],
                "see the message",
            ),
        )
    for what, why in sorted(snap.unreadable.items()):
        if what != "gateway":
            out.add(
                R_OTHER + 30,
                Finding(
                    "info",
                    "NotChecked",
                    f"{what} not checked",
                    why,
                    "grant read access, or run it where it is",
                ),
            )


CHECKS: tuple[Check, ...] = (
    _check_gateway,
    _check_multus,
    _check_pod_creation,
    _check_nodes,
    _check_sysctls,
    _check_sandbox,
    _check_secrets,
    _check_config,
    _check_cloud,
    _check_agent,
    _check_tunnels,
    _check_pod,
    _check_rest,
)


def diagnose(snap: Snapshot) -> list[Finding]:
    """Every problem, most important first: errors before warnings before notes, upstream causes first."""
    out = _Found()
    conds = conditions(snap.gateway)
    for check in CHECKS:
        check(snap, conds, out)
        if snap.gateway is None:
            break
    seen: set[tuple[str, str]] = set()
    ordered = []
    for rank, f in sorted(out.findings, key=lambda rf: (SEVERITIES.index(rf[1].severity), rf[0])):
        if (f.code, f.what) not in seen:
            seen.add((f.code, f.what))
            ordered.append(f)
        del rank
    return ordered


def problems(findings: Sequence[Finding]) -> bool:
    """Whether anything is wrong (an error or a warning; notes alone are not): the exit code."""
    return any(f.severity != "info" for f in findings)


UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What a terminal acts on or a reader takes for a line break: C0 (newline, CR, ESC, ...), DEL, C1 (CSI,
NEL, ...), Unicode's line and paragraph separators, and the bidirectional controls that reorder a line."""
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(s: str) -> str:
    """``s`` on one line, inert in a terminal: each character of ``UNSAFE`` escaped visibly (``\\n``,
    ``\\x1b``, ``\\u2028``). A finding's words quote what tenants, peers and containers wrote (Event
    messages, the agent's /readyz body and lastError, container messages): printed raw, a newline there
    could forge a finding of its own (``2. [error] ... fix: kubectl ...``) and an escape sequence could
    rewrite the screen."""

    def escape(m: re.Match[str]) -> str:
        c = m.group(0)
        return NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return UNSAFE.sub(escape, s)


def text(snap: Snapshot, findings: Sequence[Finding]) -> str:
    """The findings for a person: each one block of three lines, every word in it made ``printable`` (JSON
    escapes by itself)."""
    ready = conditions(snap.gateway).get("Ready")
    state = "Ready" if ready is not None and ready.get("status") == "True" else "not Ready"
    if snap.gateway is None:
        state = "not found" if "gateway" not in snap.unreadable else "unreadable"
    count = sum(1 for f in findings if f.severity != "info")
    lines = [f"{printable(str(snap.key))}: {state}; {count or 'no'} problem{'s' if count != 1 else ''} found"]
    if snap.readyz is not None and snap.readyz.code is not None:
        lines.append(f"status-agent /readyz: HTTP {snap.readyz.code}, read through {snap.readyz.via}")
    for i, f in enumerate(findings, 1):
        lines += [
            f"{i}. [{f.severity}] {printable(f.code)}: {printable(f.what)}",
            f"   cause: {printable(f.cause)}",
            f"   fix:   {printable(f.fix)}",
        ]
    return "\n".join(lines) + "\n"


def as_json(snap: Snapshot, findings: Sequence[Finding]) -> str:
    ready = conditions(snap.gateway).get("Ready")
    doc = {
        "gateway": {"kind": snap.key.kind, "namespace": snap.key.namespace, "name": snap.key.name},
        "found": snap.gateway is not None,
        "ready": ready is not None and ready.get("status") == "True",
        "problems": problems(findings),
        "findings": [f.to_dict() for f in findings],
        "readyz": None
        if snap.readyz is None
        else {"code": snap.readyz.code, "via": snap.readyz.via if snap.readyz.code is not None else None},
    }
    return json.dumps(doc, indent=2) + "\n"
